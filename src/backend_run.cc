#include "backend_run.h"

#include "backends/cpu/attention_cpu.h"
#include "backends/reference/attention_ref.h"
#include "contract/sinks.h"

namespace attn::detail {

namespace {

// The cpu kernels compute without sinks; contract::fold_sinks adds them after, from f32 results for
// 16-bit outputs (one rounding).
void cpu_forward(contract::ForwardProblem& p) {
  if (p.sinks.empty()) return cpu::forward(p);
  const Tensor out = p.out, weights = p.weights;
  if (p.dtype != DType::f32) {
    p.out = Tensor::empty(out.shape(), DType::f32);
    if (weights.defined()) p.weights = Tensor::empty(weights.shape(), DType::f32);
  }
  cpu::forward(p);
  contract::fold_sinks(p, p.out, out, p.weights, weights);
  p.out = out, p.weights = weights;
}

}  // namespace

void run_forward(Backend backend, contract::ForwardProblem& p) {
  if (backend == Backend::reference) {
    reference::forward(p);
  } else {
    cpu_forward(p);
  }
}

std::vector<double> run_backward(Backend backend, contract::BackwardProblem& p) {
  if (backend == Backend::reference) {
    if (!p.sinks.empty()) p.dsinks = Tensor::zeros({p.B, p.Hq}, DType::f64);
    reference::backward(p);
  } else {
    cpu::backward(p);
  }
  if (p.sinks.empty()) return {};
  if (!p.dsinks.defined()) return contract::sink_gradient(p);
  std::vector<double> dsinks(static_cast<size_t>(p.Hq), 0.0);
  const double* part = p.dsinks.data_as<double>();  // [B, Hq], summed in a fixed order
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) dsinks[h] += part[b * p.Hq + h];
  }
  return dsinks;
}

}  // namespace attn::detail
