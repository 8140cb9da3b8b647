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
