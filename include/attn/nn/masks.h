// Mask helpers as the tutorials use them, in nn.MultiheadAttention's polarity: true = NOT allowed.
#pragma once
#include <cstdint>

#include "attn/tensor.h"

namespace attn::nn {

// ids (integer) [B, L] -> bool [B, L], true where ids == pad_id (a padded key, not attended).
Tensor padding_mask(const Tensor& ids, int64_t pad_id);
// bool [L, L], true above the diagonal (j > i: a future key, not attended).
Tensor look_ahead_mask(int64_t length);
// padding [B, Lk] and look_ahead [Lq, Lk] -> bool [B, Lq, Lk], true where either forbids (logical
// or).
Tensor combine_masks(const Tensor& padding, const Tensor& look_ahead);

}  // namespace attn::nn
