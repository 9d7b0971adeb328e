// Uniform training noise (noise.h's definition) in AVX2 lanes, 16 values (8 element pairs) per
// block: the pieces the kernels that add it share, bf16 rows (noise_bf16_row.cc) and FP8 rows
// dequantized in bf16 (fp8_noise_row.cc).
//
// Per element pair k of a row:
//   bits = noise_bits(key, k)            (vpmulld; counter x 0x9E3779B9 stepped by an add instead)
//   out(2k)     = round(a(2k)     + noise_signed_low(bits)  x std)
//   out(2k + 1) = round(a(2k + 1) + noise_signed_high(bits) x std)
// A draw is (u - 32767.5) 2^-15 for a 16-bit half u: the lanes make (u - 32767.5) 2^16 with integer
// ops (exact in float32) and multiply it by std x 2^-31, whose product has the same real value, so
// the same float32 rounding, as draw x std (for |std| < 2^-95, where std x 2^-31 would be
// subnormal and inexact, the draw is first made exactly and multiplied by std: kPrescaled false).
// The product and the sum are two separately rounded float32 operations, as in the scalar code: no
// FMA (the target does not enable it, so the compiler cannot contract them either).
//
// Lanes: a block's 16 values are worked on as two vectors of 8 floats, values 0-3 and 8-11 (the
// "a" half) and 4-7 and 12-15 (the "b" half), the order in which vpunpcklwd / vpunpckhwd widen
// 16-bit words within 128-bit lanes. One unpack each makes a bf16 block's floats (the value in the
// high half, zeros below: exact), and one unpack each makes the draws of the 8 pairs' two halves in
// the same order (a 16-bit half in the high half, 0x8000 below), so neither needs shifts, masks or
// blends to pull a pair's even and odd values apart. The round to bf16 is float_to_bf16's round to
// nearest even on all 16 results at once in 16-bit lanes (store_noised). So the bits are the
// scalar definition's (tests/cpp/batch_noise_bf16_row_test.cc, batch_fp8_noise_row_test.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/vector_store.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// The noise terms (draw x std, each rounded once to float32) of one block, in the lane order
// above: values 0-3 and 8-11, values 4-7 and 12-15.
struct NoiseTerms {
  __m256 a;
  __m256 b;
};

// Successive blocks' noise terms of one row, from pair 0 on. next() hands out a block's terms made
// two calls earlier: they depend on nothing a kernel loads, so making them ahead lets them run
// while the previous blocks wait for their values (the hash, draw and product are a chain of ~20
// cycles; docs/decisions.md has the gain).
template <bool kPrescaled>
class UniformNoiseBlocks {
 public:
  __attribute__((target("avx2"))) UniformNoiseBlocks(std::uint32_t key, float std_dev)
      : scale_(_mm256_set1_ps(kPrescaled ? std_dev * 0x1p-31f : std_dev)),
        key_(_mm256_set1_epi32(static_cast<int>(key))),
        // counter x 0x9E3779B9 for the 8 pairs of a block, stepped by 8 x 0x9E3779B9 (mod 2^32,
        // as the scalar multiply wraps).
        counter_(_mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                    _mm256_set1_epi32(static_cast<int>(0x9E3779B9u)))) {
    ahead_[0] = make();
    ahead_[1] = make();
  }

  __attribute__((target("avx2"))) NoiseTerms next() {
    const NoiseTerms now = ahead_[0];
    ahead_[0] = ahead_[1];
    ahead_[1] = make();
    return now;
  }

 private:
  __attribute__((target("avx2"))) NoiseTerms make() {
    // noise_bits (noise.h) for the block's 8 pairs.
    __m256i x = _mm256_xor_si256(key_, counter_);
    counter_ = _mm256_add_epi32(counter_, _mm256_set1_epi32(static_cast<int>(8u * 0x9E3779B9u)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    // The draws x 2^31 as exact integers: for a 16-bit half u, noise_signed_low/high give
    // (u + 0.5) 2^-15 - 1 = (u - 32767.5) 2^-15, and (u - 32767.5) 2^16 is the 32-bit integer
    // with (u ^ 0x8000), read signed, in the high half and 0x8000 in the low half (17
    // significant bits: exact in float32). Each unpack interleaves 0x8000 words with the draws'
    // halves, pair k's low half (its even value's) before its high half, pairs 0-1 and 4-5 into
    // the "a" lanes, 2-3 and 6-7 into the "b" lanes: the values' order (above).
    const __m256i flipped = _mm256_xor_si256(x, _mm256_set1_epi32(static_cast<int>(0x80008000u)));
    const __m256i half = _mm256_set1_epi16(static_cast<short>(0x8000));
    return {term(_mm256_unpacklo_epi16(half, flipped)), term(_mm256_unpackhi_epi16(half, flipped))};
  }

  __attribute__((target("avx2"))) __m256 term(__m256i scaled_draw) const {
    __m256 draw = _mm256_cvtepi32_ps(scaled_draw);
    if constexpr (!kPrescaled) draw = _mm256_mul_ps(draw, _mm256_set1_ps(0x1p-31f));
    return _mm256_mul_ps(draw, scale_);
  }

  __m256 scale_;  // std x 2^-31 (exact) when kPrescaled, else std
  __m256i key_;
  __m256i counter_;
  NoiseTerms ahead_[2];
};

// Calls `kernel.template operator()<kPrescaled, kStream>()` with the noise-term form `std_dev`
// needs (std x 2^-31 is exact unless it is subnormal, below 2^-95: then kPrescaled is false and
// the draw is scaled back first, exact too; either way the product's real value, hence its
// float32 rounding, is draw x std's) and the stores asked for (`stream`, vector_store.h).
template <class Kernel>
inline auto with_noise_form(float std_dev, bool stream, Kernel kernel) {
  if (std_dev == 0.0f || std::fabs(std_dev) >= 0x1p-95f) {
    return stream ? kernel.template operator()<true, true>()
                  : kernel.template operator()<true, false>();
  }
  return stream ? kernel.template operator()<false, true>()
                : kernel.template operator()<false, false>();
}

// One block: the 16 bf16 values at `values` (in order) plus `terms`, stored at `dst` as 16 floats
// (kF32) or 16 bf16, in order.
template <bool kF32, bool kStream>
__attribute__((target("avx2"))) inline void store_noised(std::uint8_t* dst, __m256i values,
                                                         NoiseTerms terms) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256 a = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, values)), terms.a);
  const __m256 b = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, values)), terms.b);
  if constexpr (kF32) {
    // a's and b's low 128-bit lanes are values 0-3 and 4-7, their high lanes 8-11 and 12-15.
    vector_store<kStream>(dst, _mm256_castps_si256(_mm256_permute2f128_ps(a, b, 0x20)));
    vector_store<kStream>(dst + 32, _mm256_castps_si256(_mm256_permute2f128_ps(a, b, 0x31)));
  } else {
    // float_to_bf16's round to nearest even on the 16 results at once, in 16-bit lanes: the
    // truncated bf16 results (each float's high half), plus the carry out of the dropped low
    // halves + 0x7FFF + the truncation's lowest bit, which is bit 15 of
    // vpavgw(low, 0x7FFE | bit) = (low + 0x7FFF + bit) >> 1 (a 17-bit sum). A byte shuffle
    // gathers each 128-bit lane's four high halves into its low 8 bytes and four low halves
    // into its high 8 bytes; the 64-bit unpacks then line a's and b's up in the values' order.
    // Without float_to_bf16's NaN select: every NaN here has 16 low zero bits (a bf16 source's
    // NaN, quieted by the add, or Inf - Inf's default NaN; a noise term is never NaN, a NaN std
    // goes to the scalar code), which get no carry, and is quiet already.
    const __m256i halves = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2,
                                            3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13);
    const __m256i a_halves = _mm256_shuffle_epi8(_mm256_castps_si256(a), halves);
    const __m256i b_halves = _mm256_shuffle_epi8(_mm256_castps_si256(b), halves);
    const __m256i truncated = _mm256_unpacklo_epi64(a_halves, b_halves);
    const __m256i dropped = _mm256_unpackhi_epi64(a_halves, b_halves);
    const __m256i bias = _mm256_or_si256(_mm256_and_si256(truncated, _mm256_set1_epi16(1)),
                                         _mm256_set1_epi16(0x7FFE));
    const __m256i carry = _mm256_srli_epi16(_mm256_avg_epu16(dropped, bias), 15);
    vector_store<kStream>(dst, _mm256_add_epi16(truncated, carry));
  }
}

}  // namespace draftfeed

#endif
