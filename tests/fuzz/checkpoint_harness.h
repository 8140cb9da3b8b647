// Fuzz harness for checkpoint loading (attn::nn::Module::load of a safetensors file): the input
// bytes are the file, loaded into a small Transformer encoder layer (d_model 8, 2 heads,
// feed-forward 16). Input format: byte 0 bit 0 picks the name matching (0 = strict, 1 =
// non-strict); bytes 1.. are the safetensors file (an empty input is an empty file, strict).
// Invariants: the load either succeeds or raises attn::Error naming a function (nothing else); a
// failed load leaves every parameter bit for bit as it was (no partial load); whether a load fails
// does not depend on the module's current values; a successful load gives parameters that survive
// save + load bit for bit.
//
// Stateless: every input gets fresh layers whose parameters are set to fixed fills, so an input
// does the same alone, in a replay or in the middle of a fuzzing run (the layer's random
// initialisation and the global nn generator play no part). A refused load is tried from two fills
// that differ in every element of every parameter: a tensor copied before the refusal changes at
// least one of them, whatever values the file holds (one fill alone misses a copied tensor whose
// values equal the fill, as the first harness, loading into one long-lived layer, missed copies of
// the values it already held).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <typeinfo>

#include "attn/nn/transformer.h"
#include "fuzz/reader_checks.h"

namespace attn::fuzz {

// A fresh encoder layer with every parameter filled with `fill` (its random initialisation is
// overwritten, so the global generator it advanced has no effect here).
inline std::unique_ptr<nn::TransformerEncoderLayer> checkpoint_model(double fill) {
  nn::TransformerLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 16;
  o.dropout = 0.0;
  auto model = std::make_unique<nn::TransformerEncoderLayer>(o);
  for (auto& p : model->named_parameters()) p.value.fill(fill);
  return model;
}

// The two fills a refused load starts from: exact in every floating dtype and different in every
// one, so a copied element (any value, any dtype) equals at most one of them bit for bit.
inline constexpr double kCheckpointFills[2] = {0.0, -1.5};

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

// Loads `path` into `model`; true when it loaded, false when it refused with an attn::Error.
inline bool load_or_refuse(nn::Module& model, const std::string& path, bool strict) {
  try {
    model.load(path, strict);
    return true;
  } catch (const Error& e) {
    require(starts_with(e.what(), "attn::"),
            std::string("load's message does not name a function: ") + e.what());
  } catch (const std::exception& e) {
    violation(std::string("Module::load threw ") + typeid(e).name() +
              " instead of attn::Error: " + e.what());
  }
  return false;
}

inline void fuzz_checkpoint(const uint8_t* data, size_t size) {
  const bool strict = size == 0 || (data[0] & 1) == 0;
  const uint8_t* file = size > 0 ? data + 1 : data;
  const size_t file_size = size > 0 ? size - 1 : 0;
  const std::string path = write_scratch_file("checkpoint.safetensors", file, file_size);

  const auto model = checkpoint_model(kCheckpointFills[0]);
  const TensorList before = snapshot(*model);
  if (!load_or_refuse(*model, path, strict)) {
    require_same_state(before, snapshot(*model), "a failed load");
    const auto other = checkpoint_model(kCheckpointFills[1]);
    const TensorList other_before = snapshot(*other);
    require(!load_or_refuse(*other, path, strict),
            "the load failed into one layer and succeeded into the same layer with other values");
    require_same_state(other_before, snapshot(*other), "a failed load");
    return;
  }
  const TensorList after = snapshot(*model);
  const std::string copy = (scratch_dir() / "checkpoint_roundtrip.safetensors").string();
  model->save(copy);
  model->load(copy, true);
  require_same_state(after, snapshot(*model), "save + load of a loaded checkpoint");
}

}  // namespace attn::fuzz
