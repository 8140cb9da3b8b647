// Reading and writing tensors as files.
#pragma once
#include <string>

#include "attn/tensor.h"

namespace attn {

// NumPy .npy (format 1.0 - 3.0). Reads f64, f32, f16, bool, i32, i64 (little- or big-endian, C or Fortran
// order); anything else is refused with an attn::Error naming the file and the dtype.
Tensor read_npy(const std::string& path);
// Writes little-endian C order; bf16 is written as f32 (NumPy has no bf16). The file appears whole or not
// at all: the bytes go to a temporary file in the same folder, renamed over `path` at the end.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace attn

#include <map>
#include <utility>
#include <vector>

namespace attn {

// Named tensors in a fixed order (the order of a state dict).
using TensorList = std::vector<std::pair<std::string, Tensor>>;

// safetensors: an 8-byte little-endian header length, a JSON header (name -> dtype, shape, data_offsets;
// optional "__metadata__" of strings), then the raw little-endian bytes. Reads F64, F32, BF16, F16, BOOL,
// I32, I64; offsets that overlap, leave gaps, run past the file or disagree with dtype x shape are refused
// with an attn::Error naming the file and the tensor. Writing is atomic like write_npy.
TensorList read_safetensors(const std::string& path,
                            std::map<std::string, std::string>* metadata = nullptr);
void write_safetensors(const std::string& path, const TensorList& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace attn
