// Uniform training noise (noise.h's definition) in AVX-512 lanes, 32 values (16 element pairs)
// per block, bf16 results: what the 512-bit kernels share, for bf16 rows
// (noise_bf16_row_avx512.cc) and FP8 rows dequantized in bf16 (fp8_noise_row_avx512.cc).
//
// The arithmetic is noise_lanes.h's (which says why it is exact), in the same lane order within
// each 128-bit lane: a block's floats and draws are widened by vpunpcklwd / vpunpckhwd, so the
// "a" vector holds values 8L..8L+3 of 128-bit lane L and the "b" vector values 8L+4..8L+7. What
// differs is the round to bf16: one vcvtne2ps2bf16 (AVX512_BF16) makes all 32 bf16 results, to
// nearest even as float_to_bf16 does, and one qword permute puts them in order. That instruction
// takes a subnormal float as zero, where float_to_bf16 rounds it to a subnormal bf16: a block
// with a subnormal sum (vfpclassps says; rare: the value and its noise must nearly cancel below
// 2^-126) is rounded by integer adds instead, which is float_to_bf16 for every non-NaN float. Its
// NaNs (a bf16 source's, quieted by the add, or Inf - Inf's) have 16 low zero bits, which both
// ways keep.
#pragma once

#include <cstdint>

#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/vector_lanes_avx512.h"
#include "draftfeed/common/cpu_features.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

struct NoiseTerms512 {
  __m512 a;  // values 8L..8L+3 of each 128-bit lane L
  __m512 b;  // values 8L+4..8L+7
};

// Successive blocks' noise terms of one row, from pair 0 on, made two blocks ahead (as
// noise_lanes.h's UniformNoiseBlocks, which says why).
template <bool kPrescaled>
class UniformNoiseBlocks512 {
 public:
  __attribute__((target(DRAFTFEED_AVX512_TARGET)))
  UniformNoiseBlocks512(std::uint32_t key, float std_dev)
      : scale_(_mm512_set1_ps(kPrescaled ? std_dev * 0x1p-31f : std_dev)),
        key_(_mm512_set1_epi32(static_cast<int>(key))),
        counter_(_mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(static_cast<int>(0x9E3779B9u)))) {
    ahead_[0] = make();
    ahead_[1] = make();
  }

  __attribute__((target(DRAFTFEED_AVX512_TARGET))) NoiseTerms512 next() {
    const NoiseTerms512 now = ahead_[0];
    ahead_[0] = ahead_[1];
    ahead_[1] = make();
    return now;
  }

 private:
  __attribute__((target(DRAFTFEED_AVX512_TARGET))) NoiseTerms512 make() {
    __m512i x = _mm512_xor_si512(key_, counter_);
    counter_ = _mm512_add_epi32(counter_, _mm512_set1_epi32(static_cast<int>(16u * 0x9E3779B9u)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7FEB352D));
    // x ^ (x >> 15), and each 16-bit half's top bit flipped (noise_lanes.h: the draw x 2^31 is
    // that half, read signed, above 0x8000), in one three-way xor.
    const __m512i flipped = _mm512_ternarylogic_epi32(
        x, _mm512_srli_epi32(x, 15), _mm512_set1_epi32(static_cast<int>(0x80008000u)), 0x96);
    const __m512i half = _mm512_set1_epi16(static_cast<short>(0x8000));
    return {term(_mm512_unpacklo_epi16(half, flipped)), term(_mm512_unpackhi_epi16(half, flipped))};
  }

  __attribute__((target(DRAFTFEED_AVX512_TARGET))) __m512 term(__m512i scaled_draw) const {
    __m512 draw = _mm512_cvtepi32_ps(scaled_draw);
    if constexpr (!kPrescaled) draw = _mm512_mul_ps(draw, _mm512_set1_ps(0x1p-31f));
    return _mm512_mul_ps(draw, scale_);
  }

  __m512 scale_;
  __m512i key_;
  __m512i counter_;
  NoiseTerms512 ahead_[2];
};

// One block: the 32 bf16 values `values` (in order) plus `terms`, rounded to 32 bf16 results in
// order. `lanes` masks the block's values in the row (all 32 but at the row's end); where it is
// not full the results are stored with a masked ordinary store.
template <bool kStream>
__attribute__((target(DRAFTFEED_AVX512_TARGET))) inline void store_noised512(
    std::uint8_t* dst, __m512i values, NoiseTerms512 terms, __mmask32 lanes = ~__mmask32{0}) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512 a = _mm512_add_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, values)), terms.a);
  const __m512 b = _mm512_add_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, values)), terms.b);
  __m512i out;
  constexpr int kSubnormal = 0x20;  // vfpclassps category
  if (_kortestz_mask16_u8(_mm512_fpclass_ps_mask(a, kSubnormal),
                          _mm512_fpclass_ps_mask(b, kSubnormal)) != 0) {
    // Words 0-15 are a's (values 0-3, 8-11, 16-19, 24-27), 16-31 b's: qwords 0 4 1 5 2 6 3 7
    // are then values 0-3, 4-7, 8-11, ... in order.
    const __m512i rounded = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    out = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), rounded);
  } else {
    // packus takes 4 dwords of a then 4 of b per 128-bit lane: values 8L..8L+7, in order.
    out = _mm512_packus_epi32(round_to_bf16_low512(a), round_to_bf16_low512(b));
  }
  if (lanes == ~__mmask32{0}) {
    store512<kStream>(dst, out);
  } else {
    _mm512_mask_storeu_epi16(dst, lanes, out);
  }
}

}  // namespace draftfeed

#endif
