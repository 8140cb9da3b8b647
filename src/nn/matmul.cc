// oneDNN matmul primitives, one per shape (see matmul.h).
#include "nn/matmul.h"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/parallel.h"
#include "nn/ops.h"

namespace attn::nn::detail {

namespace {

dnnl::memory::data_type type_of(MatmulType t) {
  return t == MatmulType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// The memory descriptors of x [M, K], w (w [N, K] row-major is the [K, N] matrix in layout ba),
// bias [1, N] and y [M, N].
struct Descs {
  dnnl::memory::desc x, w, bias, y;
};
// The layouts a product reads and writes (Matmul's flags); part of a primitive's key.
struct Layout {
  bool x_km = false, w_kn = false, accumulate = false;
  auto operator<=>(const Layout&) const = default;
};
Descs descs_of(MatmulType in, MatmulType out, int64_t M, int64_t N, int64_t K, Layout l) {
  using tag = dnnl::memory::format_tag;
  return {{{M, K}, type_of(in), l.x_km ? tag::ba : tag::ab},
          {{K, N}, type_of(in), l.w_kn ? tag::ab : tag::ba},
          {{1, N}, type_of(in), tag::ab},
          {{M, N}, type_of(out), tag::ab}};
}

// A primitive, its operands' descriptors and the scratchpad it asks for. The scratchpad is the
// caller's (scratchpad mode user): in oneDNN's default mode the scratchpad is shared and a
// primitive must run on the thread that created it, while these are created once and then run from
// whichever thread calls (the GIL is released around the modules' calls, so two Python threads may
// run the same product at once).
struct Made {
  dnnl::matmul prim;
  Descs descs;
  dnnl::memory::desc scratchpad;
};

struct Primitives {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<std::tuple<int64_t, int64_t, int64_t, MatmulType, MatmulType, bool,
                      std::optional<Activation>, Layout>,
           Made>
      made;
};
Primitives& primitives() {
  // The engine is oneDNN's first use on this path: the instruction-set cap comes before it.
  static Primitives p = [] {
    cap_onednn_isa();
    return Primitives{};
  }();
  return p;
}

// Per calling thread: its stream and its scratchpad (grows, never shrinks).
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(primitives().engine);
  return stream;
}
void* thread_scratchpad(size_t bytes) {
  thread_local std::vector<unsigned char> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// The activation as oneDNN's eltwise post-op, or (accumulate) the sum post-op; neither: none.
dnnl::primitive_attr post_ops_attr(std::optional<Activation> act, bool accumulate) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (accumulate) ops.append_sum(1.0f);
  if (act) {
    using alg = dnnl::algorithm;
    const alg a = *act == Activation::relu        ? alg::eltwise_relu
                  : *act == Activation::gelu      ? alg::eltwise_gelu_erf
                  : *act == Activation::gelu_tanh ? alg::eltwise_gelu_tanh
                                                  : alg::eltwise_swish;
    ops.append_eltwise(1.0f, a, *act == Activation::silu ? 1.0f : 0.0f, 0.0f);
  }
  if (accumulate || act) attr.set_post_ops(ops);
  return attr;
}

dnnl::matmul::primitive_desc desc_of(MatmulType in, MatmulType out, int64_t M, int64_t N, int64_t K,
                                     bool bias, std::optional<Activation> act, Layout l) {
  const Descs d = descs_of(in, out, M, N, K, l);
  const dnnl::matmul::desc md =
      bias ? dnnl::matmul::desc(d.x, d.w, d.bias, d.y) : dnnl::matmul::desc(d.x, d.w, d.y);
  return dnnl::matmul::primitive_desc(md, post_ops_attr(act, l.accumulate), primitives().engine);
}

Made primitive_for(const Matmul& m) {
  Primitives& p = primitives();
  const Layout l{m.x_km, m.w_kn, m.accumulate};
  const auto key = std::make_tuple(m.M, m.N, m.K, m.in, m.out, m.bias != nullptr, m.activation, l);
  const std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.made.find(key);
  if (it == p.made.end()) {
    if (p.made.size() > 256) p.made.clear();  // many batch shapes: start over
    const auto pd = desc_of(m.in, m.out, m.M, m.N, m.K, m.bias != nullptr, m.activation, l);
    it = p.made
             .emplace(key, Made{dnnl::matmul(pd), descs_of(m.in, m.out, m.M, m.N, m.K, l),
                                pd.scratchpad_desc()})
             .first;
  }
  return it->second;
}

}  // namespace

void run_matmul(const Matmul& m) {
  const Made made = primitive_for(m);
  Primitives& p = primitives();
  const Descs& d = made.descs;
  auto mem = [&](const dnnl::memory::desc& md, const void* ptr) {
    return dnnl::memory(md, p.engine, const_cast<void*>(ptr));
  };
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, mem(d.x, m.x)},
                                                {DNNL_ARG_WEIGHTS, mem(d.w, m.w)},
                                                {DNNL_ARG_DST, mem(d.y, m.y)}};
  if (m.bias) args.emplace(DNNL_ARG_BIAS, mem(d.bias, m.bias));
  if (made.scratchpad.get_size() > 0) {
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 mem(made.scratchpad, thread_scratchpad(made.scratchpad.get_size())));
  }
  const double work =
      static_cast<double>(m.M) * static_cast<double>(m.N) * static_cast<double>(m.K);
  const OmpThreadsFor threads(work < 4e6 ? 1 : resolve_threads(0));
  made.prim.execute(thread_stream(), args);
  thread_stream().wait();
}

std::string matmul_impl(MatmulType in, MatmulType out, int64_t M, int64_t N, int64_t K) {
  return desc_of(in, out, M, N, K, true, std::nullopt, Layout{}).impl_info_str();
}

}  // namespace attn::nn::detail
