// attn._core.build_info: the version and the kernels each family runs on this processor
// (include/attn/info.h, and nn::gemm_kernels for the nn layers' products), as `attn info` prints them.
#include <nanobind/stl/string.h>  // every file casting std::string must see this caster (ODR)
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "attn/info.h"
#include "attn/nn/layers.h"
#include "bindings.h"

namespace nb = nanobind;

namespace attn::python {

void bind_info(nb::module_& m) {
  m.def(
      "build_info",
      [] {
        const KernelChoice c = kernel_choice();
        nb::dict d;
        d["version"] = std::string(version());
        d["cpu"] = c.cpu;
        d["available"] = c.available;
        d["isa"] = c.isa;
        d["isa_source"] = c.isa_source;
        d["attention_f32"] = c.attention_f32;
        d["attention_bf16"] = c.attention_bf16;
        d["elementwise"] = c.elementwise;
        d["gemm"] = nn::gemm_kernels();
        d["bf16_gemm_native"] = nn::gemm_bf16_native();
        return d;
      },
      nb::sig("def build_info() -> dict[str, Any]"),
      "This build of attn and the kernels it runs here: {version, cpu, available (the instruction "
      "sets this CPU runs), isa (the one every kernel family follows), isa_source ('best "
      "available', 'ATTN_CPU_ISA' or 'forced'), attention_f32, attention_bf16, elementwise, gemm "
      "(the nn layers' product routing), bf16_gemm_native}. Raises ValueError when ATTN_CPU_ISA "
      "names a target this CPU cannot run.");
}

}  // namespace attn::python
