// Fuzz harness for checkpoint loading (attn::nn::Module::load of a safetensors file): the input
// bytes are the file, loaded into a small Transformer encoder layer (d_model 8, 2 heads,
// feed-forward 16). Invariants: the load either succeeds or raises attn::Error (nothing else); a
// failed load leaves every parameter exactly as it was (no partial load); a successful load gives
// parameters that survive save + load bit for bit. The first byte picks strict or non-strict name
// matching.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "attn/nn/transformer.h"
#include "fuzz/reader_checks.h"

namespace attn::fuzz {

inline nn::TransformerEncoderLayer& checkpoint_model() {
  static const std::unique_ptr<nn::TransformerEncoderLayer> model = [] {
    nn::TransformerLayerOptions o;
    o.d_model = 8;
    o.nhead = 2;
    o.dim_feedforward = 16;
    o.dropout = 0.0;
    return std::make_unique<nn::TransformerEncoderLayer>(o);
  }();
  return *model;
}

inline TensorList snapshot(const nn::Module& m) {
  TensorList s = m.state_dict();
  for (auto& [name, t] : s) t = t.clone();
  return s;
}

inline void require_same_state(const TensorList& a, const TensorList& b, const std::string& what) {
  require(a.size() == b.size(), what + ": the number of parameters changed");
  for (size_t i = 0; i < a.size(); ++i) {
    require(a[i].first == b[i].first && same_bytes(a[i].second, b[i].second),
            what + ": parameter '" + a[i].first + "' changed");
  }
}

inline void fuzz_checkpoint(const uint8_t* data, size_t size) {
  nn::TransformerEncoderLayer& model = checkpoint_model();
  const bool strict = size == 0 || (data[0] & 1) == 0;
  const uint8_t* file = size > 0 ? data + 1 : data;
  const size_t file_size = size > 0 ? size - 1 : 0;
  const std::string path = write_scratch_file("checkpoint.safetensors", file, file_size);
  const TensorList before = snapshot(model);
  bool loaded = false;
  try {
    model.load(path, strict);
    loaded = true;
  } catch (const Error& e) {
    require(starts_with(e.what(), "attn::"),
            std::string("load's message does not name a function: ") + e.what());
  } catch (const std::exception& e) {
    violation(std::string("Module::load threw ") + typeid(e).name() +
              " instead of attn::Error: " + e.what());
  }
  if (!loaded) {
    require_same_state(before, snapshot(model), "a failed load");
    return;
  }
  const TensorList after = snapshot(model);
  const std::string copy = (scratch_dir() / "checkpoint_roundtrip.safetensors").string();
  model.save(copy);
  model.load(copy, true);
  require_same_state(after, snapshot(model), "save + load of a loaded checkpoint");
}

}  // namespace attn::fuzz
