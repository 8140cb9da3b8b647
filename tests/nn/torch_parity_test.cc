// Parity with PyTorch: the fixtures written by tests/make_torch_fixtures.py (nn.MultiheadAttention,
// nn.TransformerEncoderLayer, nn.TransformerDecoderLayer) are loaded into attn's modules by their
// state-dict names; outputs, attention weights and every gradient must match, in f64 (to roundoff)
// and in f32 (relative error <= 1e-5 against PyTorch's float64 results).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "attn/io.h"
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

namespace fs = std::filesystem;
using testing::rel_error;

const fs::path kFixtures = fs::path(ATTN_SOURCE_DIR) / "tests" / "fixtures" / "torch";

struct Fixture {
  nlohmann::json config;
  std::map<std::string, Tensor> files;  // file stem -> tensor
  Tensor get(const std::string& stem) const {
    auto it = files.find(stem);
    if (it == files.end()) throw std::runtime_error("fixture file missing: " + stem);
    return it->second;
  }
  bool has(const std::string& stem) const { return files.count(stem) > 0; }
  TensorList params() const {
    TensorList out;
    for (const auto& [stem, t] : files)
      if (stem.rfind("param.", 0) == 0) out.emplace_back(stem.substr(6), t);
    return out;
  }
};

Fixture load_fixture(const std::string& name) {
  Fixture f;
  const fs::path dir = kFixtures / name;
  std::ifstream cfg(dir / "config.json");
  f.config = nlohmann::json::parse(cfg);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".npy")
      f.files[e.path().stem().string()] = read_npy(e.path().string());
  }
  return f;
}

double tolerance(DType dt) {
  return dt == DType::f64 ? 1e-10 : 1e-5;
}

// Compares every parameter gradient of `m` with grad.<name>.
void expect_param_grads(const Module& m, const Fixture& f, DType dt) {
  int n = 0;
  for (const auto& p : m.named_parameters()) {
    const double err = rel_error(p.grad, f.get("grad." + p.name));
    EXPECT_LT(err, tolerance(dt)) << "grad." << p.name;
    ++n;
  }
  EXPECT_EQ(n, static_cast<int>(f.params().size()));
}

class TorchParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchParity, OutputsWeightsAndGradients) {
  const Fixture f = load_fixture(GetParam());
  const std::string module = f.config["module"];
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    auto in = [&](const std::string& n) { return f.get("input." + n).to(dt); };
    auto mask = [&](const std::string& n) {
      if (!f.has("mask." + n)) return Tensor();
      const Tensor m = f.get("mask." + n);
      return m.dtype() == DType::boolean ? m : m.to(dt);
    };
    const Tensor dout = f.get("dout").to(dt);
    double out_err = 0;
    if (module == "MultiheadAttention") {
      MultiHeadAttentionOptions o;
      o.embed_dim = f.config["embed_dim"];
      o.num_heads = f.config["num_heads"];
      o.kdim = f.config.value("kdim", 0);
      o.vdim = f.config.value("vdim", 0);
      o.batch_first = f.config["batch_first"];
      o.dtype = dt;
      MultiHeadAttention m(o);
      m.load_state_dict(f.params());
      m.zero_grad();
      AttentionMasks am{.key_padding_mask = mask("key_padding_mask"),
                        .attn_mask = mask("attn_mask"),
                        .need_weights = true,
                        .average_attn_weights = f.config["average_attn_weights"]};
      const bool self = f.config["self"];
      const MhaOutput r =
          self ? m.forward_self(in("x"), am) : m.forward(in("query"), in("key"), in("value"), am);
      out_err = rel_error(r.output, f.get("out"));
      EXPECT_LT(rel_error(r.weights, f.get("weights")), tolerance(dt)) << "weights";
      if (self) {
        EXPECT_LT(rel_error(m.backward_self(dout), f.get("grad_input.x")), tolerance(dt))
            << "grad x";
      } else {
        const MhaGrads g = m.backward(dout);
        EXPECT_LT(rel_error(g.dquery, f.get("grad_input.query")), tolerance(dt)) << "grad query";
        EXPECT_LT(rel_error(g.dkey, f.get("grad_input.key")), tolerance(dt)) << "grad key";
        EXPECT_LT(rel_error(g.dvalue, f.get("grad_input.value")), tolerance(dt)) << "grad value";
      }
      expect_param_grads(m, f, dt);
    } else {
      TransformerLayerOptions o;
      o.d_model = f.config["d_model"];
      o.nhead = f.config["nhead"];
      o.dim_feedforward = f.config["dim_feedforward"];
      o.dropout = 0.0;
      o.activation = parse_activation(f.config["activation"]);
      o.batch_first = f.config["batch_first"];
      o.norm_first = f.config["norm_first"];
      o.dtype = dt;
      if (module == "TransformerEncoderLayer") {
        TransformerEncoderLayer l(o);
        l.load_state_dict(f.params());
        l.zero_grad();
        const Tensor y =
            l.forward(in("src"), {.src_key_padding_mask = mask("src_key_padding_mask")});
        out_err = rel_error(y, f.get("out"));
        EXPECT_LT(rel_error(l.backward(dout), f.get("grad_input.src")), tolerance(dt))
            << "grad src";
        expect_param_grads(l, f, dt);
      } else {
        ASSERT_EQ(module, "TransformerDecoderLayer");
        TransformerDecoderLayer l(o);
        l.load_state_dict(f.params());
        l.zero_grad();
        DecoderMasks dm{.tgt_mask = mask("tgt_mask"),
                        .tgt_key_padding_mask = mask("tgt_key_padding_mask"),
                        .memory_key_padding_mask = mask("memory_key_padding_mask")};
        const Tensor y = l.forward(in("tgt"), in("memory"), dm);
        out_err = rel_error(y, f.get("out"));
        const DecoderGrads g = l.backward(dout);
        EXPECT_LT(rel_error(g.dtgt, f.get("grad_input.tgt")), tolerance(dt)) << "grad tgt";
        EXPECT_LT(rel_error(g.dmemory, f.get("grad_input.memory")), tolerance(dt)) << "grad memory";
        expect_param_grads(l, f, dt);
      }
    }
    EXPECT_LT(out_err, tolerance(dt)) << "output";
  }
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kFixtures))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TorchParity, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(TorchParityFixtures, AllCasesPresent) {
  // The script writes 8 cases; a missing folder must fail here rather than shrink the suite
  // silently.
  EXPECT_EQ(fixture_names().size(), 8u);
}

}  // namespace
}  // namespace attn::nn
