// attention_backward's dweights: the gradient through the returned weights (P before dropout) folded
// into dq, dk and d(add mask), checked by central differences in double of
// L = <G, out> + <W, weights> for fixed random G and W over the contract's options; the call runs on
// the reference backend whatever the backend option says, and a dweights of the wrong shape is refused.
#include <gtest/gtest.h>

#include "attention_cases.h"

namespace attn::test {
namespace {

CaseSpec small_spec() {
  CaseSpec s;
  s.batch = {2};
  s.Hq = 2, s.Hkv = 1, s.Lq = 4, s.Lk = 5, s.D = 3, s.Dv = 2;
  return s;
}

void expect_gradcheck(const CaseSpec& s, Backend backend = Backend::reference) {
  expect_gradcheck_passes(s, 3, {true, backend});
}

TEST(WeightsGrad, PlainAndGqa) {
  expect_gradcheck(small_spec());
  CaseSpec s = small_spec();
  s.Hq = 4, s.Hkv = 2;
  expect_gradcheck(s);
}

TEST(WeightsGrad, SoftcapScaleAndAlibi) {
  CaseSpec s = small_spec();
  s.softcap = 0.8, s.scale = 0.6, s.alibi = true;
  expect_gradcheck(s);
}

TEST(WeightsGrad, CausalWindowAndKeyLengths) {
  CaseSpec s = small_spec();
  s.causal = true, s.window = Window{2, 0}, s.key_lengths = true;
  expect_gradcheck(s);
}

// d(add mask) gets the weights' part too, summed over the mask's broadcast dims.
TEST(WeightsGrad, AddMaskAndItsGradient) {
  for (Shape ms : {Shape{}, Shape{4, 5}}) {
    CaseSpec s = small_spec();
    s.mask = MaskType::add, s.mask_shape = ms;
    expect_gradcheck(s);
  }
}

// The weights are the ones before dropout: dropout changes the out path only, and with every
// weight dropped only the weights' part remains.
TEST(WeightsGrad, DropoutIncludingAllDropped) {
  for (double p : {0.3, 1.0}) {
    CaseSpec s = small_spec();
    s.dropout = p;
    expect_gradcheck(s);
  }
}

// backend=cpu with dweights runs the reference (the cpu kernels have no weights' gradient): the
// same gradients, in the inputs' dtype.
TEST(WeightsGrad, AnyBackendOptionGivesTheReferencesGradients) {
  CaseSpec s = small_spec();
  s.dtype = DType::f32;
  expect_gradcheck(s, Backend::cpu);
}

TEST(WeightsGrad, WrongShapeIsRefused) {
  const Case c = make_case(small_spec(), 5);
  AttentionOptions o = c.o;
  o.return_weights = true;
  const AttentionResult fwd = attention(c.q, c.k, c.v, o);
  const Tensor bad = Tensor::zeros({2, 2, 4, 4}, DType::f64);
  try {
    (void)attention_backward(fwd.out, c.q, c.k, c.v, fwd.out, fwd.lse, o, bad);
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(
        msg.find("attn::attention_backward: dweights must be floating with the weights' shape "
                 "[2, 2, 4, 5]"),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("[2, 2, 4, 4]"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace attn::test
