// The option table (attn/options.h, contract/options.h): enum names both ways, the scalar rules, the
// table of names, and the shared key_lengths / position checks that attn::attention and the ring use.
#include "attn/options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "attn/attn.h"
#include "contract/options.h"

namespace attn {
namespace {

template <class E>
void expect_round_trip(std::initializer_list<E> values) {
  for (E v : values) {
    EXPECT_EQ(parse_enum<E>(enum_name(v)), v) << enum_name(v);
  }
}

TEST(Options, EnumNamesRoundTrip) {
  expect_round_trip({Backend::automatic, Backend::reference, Backend::cpu});
  expect_round_trip({Align::bottom_right, Align::top_left});
  expect_round_trip({MaskType::keep, MaskType::drop, MaskType::add});
  EXPECT_STREQ(enum_name(Backend::automatic), "auto");
  EXPECT_STREQ(enum_name(Align::top_left), "top-left");
  EXPECT_STREQ(enum_name(MaskType::drop), "drop");
  // The public functions of attention.h are the table's.
  EXPECT_STREQ(align_name(Align::bottom_right), "bottom-right");
  EXPECT_EQ(parse_mask_type("add"), MaskType::add);
  EXPECT_EQ(parse_backend("cpu"), Backend::cpu);
}

TEST(Options, AliasesParseButAreNotNames) {
  EXPECT_EQ(parse_align("bottom_right"), Align::bottom_right);
  EXPECT_EQ(parse_align("top_left"), Align::top_left);
  EXPECT_EQ(enum_choices<Align>(), "bottom-right or top-left");
  EXPECT_EQ(enum_choices<Backend>(), "auto, reference or cpu");
  EXPECT_EQ(enum_choices<MaskType>(" | ", " | "), "keep | drop | add");
}

TEST(Options, UnknownNamesListTheChoices) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { parse_align("middle"); }),
            "attn::parse_align: unknown alignment 'middle' (expected bottom-right or top-left)");
  EXPECT_EQ(message([] { parse_backend("gpu"); }),
            "attn::parse_backend: unknown backend 'gpu' (expected auto, reference or cpu)");
  EXPECT_EQ(message([] { parse_mask_type("Keep"); }),
            "attn::parse_mask_type: unknown mask type 'Keep' (expected keep, drop or add)");
  EXPECT_EQ(message([] { option_info("logit_bias"); }),
            "attn::option_info: 'logit_bias' is not an attention option");
}

TEST(Options, ScalarRules) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (double v : {-2.0, 0.0, 0.125, 1e300}) EXPECT_TRUE(kScaleRule.allows(v)) << v;
  for (double v : {inf, -inf, nan}) EXPECT_FALSE(kScaleRule.allows(v)) << v;
  for (double v : {1e-300, 1.0, 50.0}) EXPECT_TRUE(kSoftcapRule.allows(v)) << v;
  for (double v : {0.0, -1.0, inf, nan}) EXPECT_FALSE(kSoftcapRule.allows(v)) << v;
  for (double v : {0.0, 0.5, 1.0}) EXPECT_TRUE(kDropoutRule.allows(v)) << v;
  for (double v : {-1e-12, 1.0 + 1e-12, nan}) EXPECT_FALSE(kDropoutRule.allows(v)) << v;
  for (double v : {-1.0, 0.0, 7.0}) EXPECT_TRUE(kWindowRule.allows(v)) << v;
  EXPECT_FALSE(kWindowRule.allows(-2.0));
}

// attn::attention's message for options o on a small problem, or "no error".
std::string attention_message(const AttentionOptions& o) {
  const Tensor q = Tensor::zeros({1, 2, 3}, DType::f32);
  try {
    (void)attention(q, q, q, o);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

// attn::attention's messages are built from the rules: "<name> <must>, got <value>".
TEST(Options, AttentionMessagesComeFromTheRules) {
  AttentionOptions o;
  o.softcap = 0.0;
  EXPECT_EQ(attention_message(o), "attn::attention: softcap must be finite and > 0, got 0");
  o = {};
  o.dropout_p = 1.5;
  EXPECT_EQ(attention_message(o), "attn::attention: dropout_p must be in [0, 1], got 1.5");
  o = {};
  o.window = {-2, 0};
  EXPECT_EQ(attention_message(o),
            "attn::attention: window bounds must be >= -1 (-1 = unbounded), got (-2, 0)");
}

TEST(Options, TableNamesAreUniqueAndFound) {
  std::set<std::string> names, flags;
  for (const OptionInfo& info : kOptionInfo) {
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    if (*info.flag != '\0') {
      EXPECT_TRUE(flags.insert(info.flag).second) << info.flag;
    }
    EXPECT_EQ(&option_info(info.name), &info);
  }
  // The scalar rules name their table rows.
  for (const ScalarRule* rule : {&kScaleRule, &kSoftcapRule, &kDropoutRule}) {
    EXPECT_STREQ(option_info(rule->name).flag, rule->flag) << rule->name;
  }
}

// Each row points at its own field: writing through the row's pointer sets the field it names.
TEST(Options, RowsPointAtTheirFields) {
  AttentionOptions o;
  o.*field_as<std::optional<double>>(option_info("softcap")) = 2.0;
  o.*field_as<std::optional<double>>(option_info("scale")) = 0.5;
  o.*field_as<double>(option_info("dropout_p")) = 0.25;
  o.*field_as<bool>(option_info("causal")) = true;
  o.*field_as<Align>(option_info("align")) = Align::top_left;
  o.*field_as<int>(option_info("threads")) = 3;
  o.*field_as<uint64_t>(option_info("seed")) = 7;
  EXPECT_EQ(o.softcap, 2.0);
  EXPECT_EQ(o.scale, 0.5);
  EXPECT_EQ(o.dropout_p, 0.25);
  EXPECT_TRUE(o.causal);
  EXPECT_EQ(o.align, Align::top_left);
  EXPECT_EQ(o.threads, 3);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(field_as<double>(option_info("causal")), nullptr);  // another kind
  EXPECT_EQ(field_as<Tensor>(option_info("mask")), &AttentionOptions::mask);
  EXPECT_EQ(field_as<Window>(option_info("window")), &AttentionOptions::window);
  for (const OptionInfo& info : kOptionInfo) {
    // A rule is for a real (checked by attn::attention and the flags) or the window's bounds.
    if (info.rule != nullptr) {
      EXPECT_TRUE(field_as<std::optional<double>>(info) || field_as<double>(info) ||
                  field_as<Window>(info))
          << info.name;
    }
    // The output requests are one direction's and never among the shared flags' inputs.
    const bool request = std::string_view(info.name) == "return_weights" ||
                         std::string_view(info.name) == "mask_grad";
    EXPECT_EQ(info.use != OptionUse::both, request) << info.name;
  }
  EXPECT_EQ(option_info("return_weights").use, OptionUse::forward);
  EXPECT_EQ(option_info("mask_grad").use, OptionUse::backward);
}

// attn::attention checks every real by its row's rule: an unset optional is not checked, a set one
// is, whatever the other options.
TEST(Options, AttentionChecksEveryRealByItsRule) {
  AttentionOptions o;
  EXPECT_EQ(attention_message(o), "no error");
  o.scale = std::numeric_limits<double>::infinity();
  EXPECT_EQ(attention_message(o), "attn::attention: scale must be finite, got inf");
  o.scale = -2.0;  // any finite scale
  o.softcap = 3.0;
  o.dropout_p = -0.5;
  EXPECT_EQ(attention_message(o), "attn::attention: dropout_p must be in [0, 1], got -0.5");
}

TEST(Options, KeyLengthsCheckWithAndWithoutTheUpperBound) {
  std::vector<int64_t> lens;
  const Tensor kl = Tensor::from_vector({2}, {3, 9}, DType::i64);
  EXPECT_EQ(contract::check_key_lengths(kl, {2}, 2, 5, &lens),
            "key_lengths[1] = 9 is outside [0, Lk = 5]");
  EXPECT_EQ(contract::check_key_lengths(kl, {2}, 2, -1, &lens), "");  // the ring: bound later
  EXPECT_EQ(lens, (std::vector<int64_t>{3, 9}));
  const Tensor neg = Tensor::from_vector({2}, {3, -1}, DType::i32);
  EXPECT_EQ(contract::check_key_lengths(neg, {2}, 2, -1, &lens), "key_lengths[1] = -1 is < 0");
  EXPECT_EQ(contract::check_key_lengths(neg, {2}, 2, 5, &lens),
            "key_lengths[1] = -1 is outside [0, Lk = 5]");
  EXPECT_EQ(contract::check_key_lengths(kl, {3}, 3, 10, &lens),
            "key_lengths of shape [2] must have the batch dims' shape [3] (or [3])");
  const Tensor f = Tensor::from_vector({2}, {3, 4}, DType::f32);
  EXPECT_EQ(contract::check_key_lengths(f, {2}, 2, 5, &lens),
            "key_lengths must be i32 or i64, got f32 with shape [2]");
}

TEST(Options, PositionRule) {
  AttentionOptions o;
  EXPECT_EQ(contract::query_offset(o, 3, 10), 7);  // bottom-right
  o.align = Align::top_left;
  EXPECT_EQ(contract::query_offset(o, 3, 10), 0);
  o.position_offset = -4;
  EXPECT_EQ(contract::query_offset(o, 3, 10), -4);
  EXPECT_EQ(contract::right_bound(o, 5), 5);
  o.causal = true;
  EXPECT_EQ(contract::right_bound(o, -1), 0);
  EXPECT_EQ(contract::right_bound(o, 5), 0);
  EXPECT_EQ(contract::right_bound(o, 0), 0);
}

// A window bound wider than any position reaches allows every key, on both backends and in both
// alignments, up to INT64_MAX: p - left and p + right + 1 overflowed near 2^63 and removed every key
// (out 0, lse -inf) or some.
TEST(Options, WindowsWiderThanAnyPositionAllowEveryKey) {
  const Tensor q =
      Tensor::from_vector({1, 1, 4, 2}, {0.1, 0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8}, DType::f32);
  const Tensor k = Tensor::from_vector({1, 1, 2, 2}, {0.3, -0.1, 0.2, 0.9}, DType::f32);
  const Tensor v = Tensor::from_vector({1, 1, 2, 1}, {1.0, 3.0}, DType::f32);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (Backend backend : {Backend::cpu, Backend::reference}) {
    for (Align align : {Align::bottom_right, Align::top_left}) {
      AttentionOptions o;
      o.backend = backend;
      o.align = align;
      const std::vector<double> all = attention(q, k, v, o).out.to_vector();
      for (int64_t w : {int64_t{1} << 61, int64_t{1} << 62, kMax - 1, kMax}) {
        for (Window win : {Window{w, -1}, Window{-1, w}, Window{w, w}}) {
          o.window = win;
          EXPECT_EQ(attention(q, k, v, o).out.to_vector(), all)
              << backend_name(backend) << " window (" << win.left << ", " << win.right << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace attn
