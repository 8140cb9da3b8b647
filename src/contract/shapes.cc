// contract::check_qkv_shapes (problem.h): the shape rules attn::attention and attn::linear_attention
// share, with one wording.
#include <fmt/format.h>

#include "contract/problem.h"

namespace attn::contract {

namespace {
// The dims before [heads, length, dim].
Shape leading_dims(const Tensor& t) {
  Shape s;
  for (int64_t i = 0; i + 3 < t.dim(); ++i) s.push_back(t.size(i));
  return s;
}
}  // namespace

std::string check_qkv_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Shape batch = leading_dims(q);
  if (leading_dims(k) != batch || leading_dims(v) != batch) {
    return fmt::format("leading batch dims of q, k and v must be equal, got q {}, k {}, v {}",
                       q.shape_str(), k.shape_str(), v.shape_str());
  }
  if (k.size(-1) != q.size(-1)) {
    return fmt::format("q and k must have the same head dim, got q {} and k {}", q.shape_str(),
                       k.shape_str());
  }
  const int64_t Hq = q.size(-3), Hkv = k.size(-3);
  if (v.size(-3) != Hkv || v.size(-2) != k.size(-2)) {
    return fmt::format("k and v must have the same heads and length, got k {} and v {}",
                       k.shape_str(), v.shape_str());
  }
  if (Hq > 0 && (Hkv == 0 || Hq % Hkv != 0)) {
    return fmt::format(
        "the query heads ({}) must be a multiple of the key/value heads ({}): q {}, k {}", Hq, Hkv,
        q.shape_str(), k.shape_str());
  }
  return "";
}

}  // namespace attn::contract
