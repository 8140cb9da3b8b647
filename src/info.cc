// attn/info.h: the version and the kernels each family runs, from core/isa.h's one choice.
#include "attn/info.h"

#include "backends/cpu/attention_cpu.h"
#include "core/isa.h"

namespace attn {

const char* version() {
  return ATTN_VERSION;
}

KernelChoice kernel_choice() {
  KernelChoice c;
  c.cpu = cpu::describe_cpu();
  for (const cpu::Isa isa : cpu::available_isas()) c.available.emplace_back(cpu::isa_name(isa));
  const cpu::Isa isa = cpu::active_isa();
  c.isa = cpu::isa_name(isa);
  c.isa_source = cpu::isa_source();
  c.attention_f32 = cpu::isa_name(cpu::isa_for(DType::f32));
  c.attention_bf16 = cpu::isa_name(cpu::isa_for(DType::bf16));
  c.elementwise = cpu::isa_name(cpu::vector_isa(isa));
  return c;
}

}  // namespace attn
