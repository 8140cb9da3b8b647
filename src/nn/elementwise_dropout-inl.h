// Inverted dropout's spans (elementwise.h: dropout_f32 / dropout_bf16), included by
// elementwise-inl.h after its helpers, in the same instruction set's anonymous namespace (no
// headers of its own). Element e of a call is kept when its draw (contract::element_draws4) >=
// threshold; y = x * scale, scale = keep_scale or 0 (so a dropped inf or NaN gives NaN, as x * 0
// does).

#if ATTN_EW_WIDTH == 16
#define ATTN_PHILOX_X16 1
#include "contract/philox_lanes-inl.h"
#elif ATTN_EW_WIDTH == 8
#define ATTN_PHILOX_X8 1
#include "contract/philox_lanes-inl.h"
#endif

// The scales of one call's elements, 64 at a time (e a multiple of 4).
class DropoutScales {
 public:
  explicit DropoutScales(const DropoutDraw& d)
      : d_(d)
#if defined(ATTN_PHILOX_X16) || defined(ATTN_PHILOX_X8)
        ,
        gen_(d.seed)
#endif
  {
  }

  // s[0, 64) = the scales of elements [e, e + 64).
  void block(int64_t e, float s[64]) const {
    const uint64_t e4 = static_cast<uint64_t>(e) >> 2;
#if defined(ATTN_PHILOX_X16) || defined(ATTN_PHILOX_X8)
    if ((e4 & 0xffffffffu) <= 0xffffffffu - 15) {  // the 16 counters share their high word
      const PhiloxLanes::V thr = PhiloxVec::set1(d_.threshold);
      for (int64_t t = 0; t < 16; t += PhiloxLanes::kCounters) {  // counters e4 + t + ...
        PhiloxLanes::V w[4];
        gen_.draws(static_cast<uint32_t>(e4 + t), static_cast<uint32_t>(e4 >> 32),
                   static_cast<uint32_t>(d_.call), static_cast<uint32_t>(d_.call >> 32), w);
        for (int k = 0; k < 4; ++k) {
          PhiloxVec::scales(s + 4 * t + PhiloxLanes::kCounters * k, w[k], thr, d_.keep_scale);
        }
      }
      return;
    }
#endif
    uint32_t r[4];
    for (uint64_t t = 0; t < 16; ++t) {
      contract::element_draws4(d_.seed, d_.call, e4 + t, r);
      for (int l = 0; l < 4; ++l) s[4 * t + l] = r[l] >= d_.threshold ? d_.keep_scale : 0.0f;
    }
  }

 private:
  DropoutDraw d_;
#if defined(ATTN_PHILOX_X16) || defined(ATTN_PHILOX_X8)
  PhiloxLanes gen_;
#endif
};

// Elements [e0, e0 + n) of the call (e0 a multiple of 4): y = x * scale, load / store of W lanes
// (and of one element for the last partial vector).
template <class LoadW, class StoreW, class Load1, class Store1>
void dropout_span(const DropoutDraw& d, int64_t e0, int64_t n, LoadW load_w, StoreW store_w,
                  Load1 load_1, Store1 store_1) {
  const DropoutScales scales(d);
  alignas(64) float s[64];
  for (int64_t i = 0; i < n; i += 64) {
    scales.block(e0 + i, s);
    const int64_t m = n - i < 64 ? n - i : 64;
    int64_t j = 0;
    for (; j + W <= m; j += W) store_w(i + j, load_w(i + j) * load(s + j));
    for (; j < m; ++j) store_1(i + j, load_1(i + j) * s[j]);
  }
}

void dropout_f32(const DropoutDraw& d, const float* x, float* y, int64_t e0, int64_t n) {
  dropout_span(
      d, e0, n, [x](int64_t i) { return load(x + i); }, [y](int64_t i, vf v) { store(y + i, v); },
      [x](int64_t i) { return x[i]; }, [y](int64_t i, float v) { y[i] = v; });
}

void dropout_bf16(const DropoutDraw& d, const uint16_t* x, uint16_t* y, int64_t e0, int64_t n) {
  dropout_span(
      d, e0, n, [x](int64_t i) { return load_bf16(x + i); },
      [y](int64_t i, vf v) { store_bf16(y + i, v); }, [x](int64_t i) { return bf16_to_f32(x[i]); },
      [y](int64_t i, float v) { y[i] = f32_to_bf16(v); });
}
