// Fuzz harness for attn::read_safetensors: the input bytes are the file. Invariants: the reader
// either refuses the file with an attn::Error naming read_safetensors, or returns defined tensors
// of readable dtypes whose bytes together fit in the file after the header (offsets may not
// overlap); the tensors and metadata survive write_safetensors + read_safetensors bit for bit.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "attn/io.h"
#include "fuzz/reader_checks.h"

namespace attn::fuzz {

inline void fuzz_safetensors(const uint8_t* data, size_t size) {
  const std::string path = write_scratch_file("input.safetensors", data, size);
  TensorList list;
  std::map<std::string, std::string> meta;
  if (!read_or_reject("attn::read_safetensors", [&] { list = read_safetensors(path, &meta); }))
    return;
  require(size >= 8, "read_safetensors accepted a file shorter than its 8-byte header length");
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
  require(header <= size - 8, "read_safetensors accepted a header length past the end of the file");
  uint64_t total = 0;
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : list) {
    require(t.defined() && readable_dtype(t.dtype()),
            "read_safetensors returned an undefined tensor or bad dtype");
    total += static_cast<uint64_t>(t.numel()) * t.itemsize();
    require(by_name.emplace(name, t).second,
            "read_safetensors returned the name '" + name + "' twice");
  }
  require(total <= size - 8 - header,
          "read_safetensors returned " + std::to_string(total) +
              " bytes of data, more than the file holds after its header");
  const std::string copy = (scratch_dir() / "roundtrip.safetensors").string();
  write_safetensors(copy, list, meta);
  TensorList back;
  std::map<std::string, std::string> meta_back;
  require(
      read_or_reject("attn::read_safetensors", [&] { back = read_safetensors(copy, &meta_back); }),
      "read_safetensors refused a file written by write_safetensors");
  require(meta_back == meta, "write_safetensors + read_safetensors changed the metadata");
  require(back.size() == list.size(),
          "write_safetensors + read_safetensors changed the number of tensors");
  for (const auto& [name, t] : back) {
    const auto it = by_name.find(name);
    require(it != by_name.end(),
            "write_safetensors + read_safetensors invented the tensor '" + name + "'");
    require(same_bytes(it->second, t),
            "write_safetensors + read_safetensors changed the tensor '" + name + "'");
  }
}

}  // namespace attn::fuzz
