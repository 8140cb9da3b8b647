// The AMX forward's tile products pipelined against its softmax (src/backends/cpu/amx_pipeline-inl.h):
// the same bits as the unpipelined path on every shape and option that reaches it (bf16 q, k and v
// on the amx targets), and within the bf16 bounds of the reference. Runs on the emulated tiles
// everywhere (AVX2 and up) and on the hardware tiles where the CPU has them, where the hardware
// forward must also give the emulation's bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <vector>

#include "attention/attention_cases.h"
#include "backends/cpu/attention_cpu.h"
#include "cpu/cpu_test_util.h"

namespace attn::test {
namespace {

std::vector<cpu::Isa> amx_targets() {
  std::vector<cpu::Isa> r;
  for (cpu::Isa isa : {cpu::Isa::amx_emulated, cpu::Isa::amx}) {
    if (cpu::isa_available(isa)) r.push_back(isa);
  }
  return r;
}

// Shapes around the pipeline's 32-row blocks (one partial block, exactly one, one and a bit, three
// and a partial one; a query tile of 128 rows holds four) and its key tiles of 512 (partial, odd,
// several: 1300 keys are two whole tiles and a partial one, whose rows meet a new max or not), with
// the options that change what a block does: causal bands, windows, key lengths and masks (removed
// keys), dropout (P rounded after the drop), the query rows' layouts, GQA, odd D and Dv.
std::vector<CaseSpec> pipeline_specs() {
  std::vector<CaseSpec> specs;
  CaseSpec s;
  s.batch = {2};
  s.Hq = 2, s.Hkv = 1, s.D = 64, s.Dv = 64;
  s.dtype = DType::bf16;
  s.value_range = 1.0;
  for (int64_t Lq : {7, 32, 45, 100, 130}) {
    s.Lq = Lq, s.Lk = Lq + 83;
    specs.push_back(s);
  }
  s.Lq = 130, s.Lk = 1300;
  specs.push_back(s);
  s.Lq = 100, s.Lk = 300;
  s.causal = true;
  for (Align align : {Align::top_left, Align::bottom_right}) {
    s.align = align;
    specs.push_back(s);
  }
  s.Lq = 700, s.Lk = 700;
  specs.push_back(s);
  s.Lq = 100, s.Lk = 300;
  s.causal = false;
  s.window = {40, 10};
  specs.push_back(s);
  s.Lq = 600, s.Lk = 600;
  specs.push_back(s);
  s.Lq = 100, s.Lk = 300;
  s.window = {};
  s.key_lengths = true;
  s.mask = MaskType::keep;
  specs.push_back(s);
  s.key_lengths = false, s.mask.reset();
  s.dropout = 0.25;
  specs.push_back(s);
  s.dropout = 0.0;
  // q read in place as the tiles' A (AMX, whole pairs): rows D apart, padded apart, H * D apart
  // (transposed); and copied (a last dim of stride 2).
  s.D = 128, s.Dv = 96, s.Lq = 130, s.Lk = 300;
  for (Layout layout : {Layout::contiguous, Layout::padded, Layout::transposed, Layout::strided}) {
    s.layout = layout;
    specs.push_back(s);
  }
  s.layout = Layout::contiguous;
  s.Hq = 4, s.Hkv = 2, s.D = 37, s.Dv = 21, s.Lq = 77, s.Lk = 129;
  specs.push_back(s);
  return specs;
}

AttentionResult run_on(cpu::Isa isa, bool pipelined, const Case& c, int threads) {
  cpu::force_isa(isa);
  cpu::set_amx_pipeline_override(pipelined ? "on" : "off");
  AttentionOptions o = c.o;
  o.backend = Backend::cpu;
  o.threads = threads;
  AttentionResult r = attention(c.q, c.k, c.v, o);
  cpu::set_amx_pipeline_override("");
  cpu::force_isa(std::nullopt);
  return r;
}

TEST(AmxPipeline, SameBitsAsTheUnpipelinedProductsAndWithinTheBf16Bounds) {
  const std::vector<cpu::Isa> targets = amx_targets();
  if (targets.empty()) GTEST_SKIP() << "no amx target (the emulation needs AVX2)";
  std::printf("[ AMX pipeline ] tested on: %s%s\n", cpu::isa_name(targets.front()),
              targets.size() > 1 ? " and the hardware tiles" : " (no hardware tiles here)");
  uint64_t seed = 900;
  for (const CaseSpec& spec : pipeline_specs()) {
    SCOPED_TRACE(spec.describe());
    const Case c = make_case(spec, ++seed);
    AttentionOptions ro = c.o;
    ro.backend = Backend::reference;
    const AttentionResult ref =
        attention(c.q.to(DType::f64), c.k.to(DType::f64), c.v.to(DType::f64), ro);
    for (cpu::Isa isa : targets) {
      SCOPED_TRACE(cpu::isa_name(isa));
      const AttentionResult off = run_on(isa, false, c, 1);
      const AttentionResult on = run_on(isa, true, c, 1);
      EXPECT_TRUE(bitwise_equal(on.out, off.out));
      EXPECT_TRUE(bitwise_equal(on.lse, off.lse));
      EXPECT_LE(rel_error(on.out, ref.out), 1.0 / 128);
      EXPECT_LE(rel_error(on.lse, ref.lse), 1e-5);
      const AttentionResult on3 = run_on(isa, true, c, 3);
      EXPECT_TRUE(bitwise_equal(on3.out, off.out)) << "3 threads";
    }
  }
}

// The hardware forward and the emulated one take different instructions for the same arithmetic:
// VREDUCEPS and VCVTNE2PS2BF16 (two vectors of P per conversion) against the 1.5 * 2^23 rounding
// and one vector per conversion in software, besides the tiles themselves. Their results must be
// the same bits on every shape and option above.
TEST(AmxForward, HardwareGivesTheEmulationsBits) {
  if (amx_targets().size() < 2) GTEST_SKIP() << "no hardware AMX tiles on this CPU";
  uint64_t seed = 950;
  for (const CaseSpec& spec : pipeline_specs()) {
    SCOPED_TRACE(spec.describe());
    const Case c = make_case(spec, ++seed);
    const AttentionResult emulated = run_on(cpu::Isa::amx_emulated, false, c, 1);
    const AttentionResult hardware = run_on(cpu::Isa::amx, false, c, 2);
    EXPECT_TRUE(bitwise_equal(hardware.out, emulated.out));
    EXPECT_TRUE(bitwise_equal(hardware.lse, emulated.lse));
  }
}

// inf and NaN values are packed as 0 and their terms added after each block's P V: a value in
// one key that rows of several blocks use reaches exactly those rows, as without the pipeline.
TEST(AmxPipeline, NonFiniteValuesReachTheSameRows) {
  const std::vector<cpu::Isa> targets = amx_targets();
  if (targets.empty()) GTEST_SKIP() << "no amx target (the emulation needs AVX2)";
  CaseSpec s;
  s.batch = {1};
  s.Hq = 1, s.Hkv = 1, s.Lq = 100, s.Lk = 150, s.D = 32, s.Dv = 32;
  s.dtype = DType::bf16;
  s.value_range = 1.0;
  s.causal = true, s.align = Align::top_left;
  Case c = make_case(s, 77);
  std::vector<double> v = c.v.to(DType::f64).to_vector();
  v[static_cast<size_t>(40 * s.Dv + 3)] = std::numeric_limits<double>::infinity();
  v[static_cast<size_t>(41 * s.Dv + 5)] = std::numeric_limits<double>::quiet_NaN();
  c.v = Tensor::from_vector(c.v.shape(), v, DType::f64).to(DType::bf16);
  for (cpu::Isa isa : targets) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const AttentionResult off = run_on(isa, false, c, 1);
    const AttentionResult on = run_on(isa, true, c, 1);
    EXPECT_TRUE(bitwise_equal(on.out, off.out));
    // Rows before 40 do not use key 40 (causal): finite; row 99 uses both: NaN in column 5.
    const std::vector<double> out = on.out.to(DType::f64).to_vector();
    EXPECT_TRUE(std::isfinite(out[static_cast<size_t>(39 * s.Dv + 3)]));
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(99 * s.Dv + 5)]));
  }
}

}  // namespace
}  // namespace attn::test
