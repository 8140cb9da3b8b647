// Fuzz harness for attn::read_npy: the input bytes are the file. Invariants: the reader either
// refuses the file with an attn::Error naming read_npy, or returns a defined tensor of a readable
// dtype whose bytes fit in the file (it cannot have invented data); that tensor survives write_npy
// + read_npy bit for bit. Allocation beyond what the file could hold is caught by libFuzzer's
// -malloc_limit_mb (scripts/fuzz.sh).
#pragma once
#include <cstdint>
#include <string>

#include "attn/io.h"
#include "fuzz/reader_checks.h"

namespace attn::fuzz {

inline void fuzz_npy(const uint8_t* data, size_t size) {
  const std::string path = write_scratch_file("input.npy", data, size);
  Tensor t;
  if (!read_or_reject("attn::read_npy", [&] { t = read_npy(path); })) return;
  require(t.defined(), "read_npy returned an undefined tensor");
  require(readable_dtype(t.dtype()) && t.dtype() != DType::bf16,
          "read_npy returned an unexpected dtype");
  const auto bytes = static_cast<uint64_t>(t.numel()) * t.itemsize();
  require(bytes <= size, "read_npy returned " + std::to_string(bytes) +
                             " bytes of data from a file of " + std::to_string(size) + " bytes");
  const std::string copy = (scratch_dir() / "roundtrip.npy").string();
  write_npy(copy, t);
  Tensor back;
  require(read_or_reject("attn::read_npy", [&] { back = read_npy(copy); }),
          "read_npy refused a file written by write_npy");
  require(same_bytes(t, back), "write_npy + read_npy changed the tensor " + t.shape_str());
}

}  // namespace attn::fuzz
