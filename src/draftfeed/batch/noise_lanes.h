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
// FMA (the target does not enable it, so the compiler cannot contract them either). A bf16 pair is
// one 32-bit word, whose low half shifted up and high half masked are the two values as floats
// exactly. The round to bf16 is float_to_bf16's round to nearest even, done on both results of a
// pair at once in 16-bit lanes (store_noised). So the bits are the scalar definition's
// (tests/cpp/batch_noise_bf16_row_test.cc, batch_fp8_noise_row_test.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/vector_store.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// The noise terms (draw x std, each rounded once to float32) of one block: its pairs' even values'
// and odd values'.
struct NoiseTerms {
  __m256 even;
  __m256 odd;
};

// Successive blocks' noise terms of one row, from pair 0 on. next() hands out a block's terms made
// two calls earlier: they depend on nothing a kernel loads, so making them ahead lets them run
// while the previous blocks wait for their values (the hash, draw and product are a chain of ~20
// cycles; measured on the 2-core EPYC, one thread, a row in L1: 3.7 G values/s made in the same
// step as they are used, 4.2 G made two steps ahead).
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
    // significant bits: exact in float32).
    const __m256i flipped = _mm256_xor_si256(x, _mm256_set1_epi32(static_cast<int>(0x80008000u)));
    const __m256i half = _mm256_set1_epi32(0x8000);
    return {term(_mm256_or_si256(_mm256_slli_epi32(flipped, 16), half)),
            term(_mm256_blend_epi16(flipped, half, 0x55))};
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

// One block: the 16 bf16 values of `pair` (each 32-bit word a pair, the even value in its low
// half) plus `terms`, stored at `dst` as 16 floats (kF32) or 16 bf16.
template <bool kF32, bool kStream>
__attribute__((target("avx2"))) inline void store_noised(std::uint8_t* dst, __m256i pair,
                                                         NoiseTerms terms) {
  const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
  const __m256 odd =
      _mm256_castsi256_ps(_mm256_and_si256(pair, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  const __m256 even_out = _mm256_add_ps(even, terms.even);
  const __m256 odd_out = _mm256_add_ps(odd, terms.odd);
  if constexpr (kF32) {
    // unpack interleaves within 128-bit halves; permute2f128 puts values 0-7 and 8-15 together.
    const __m256 first = _mm256_unpacklo_ps(even_out, odd_out);   // 0 1 2 3 | 8 9 10 11
    const __m256 second = _mm256_unpackhi_ps(even_out, odd_out);  // 4 5 6 7 | 12 13 14 15
    vector_store<kStream>(dst, _mm256_castps_si256(_mm256_permute2f128_ps(first, second, 0x20)));
    vector_store<kStream>(dst + 32,
                          _mm256_castps_si256(_mm256_permute2f128_ps(first, second, 0x31)));
  } else {
    // float_to_bf16's round to nearest even on both results at once, in 16-bit lanes: the
    // truncated bf16 pair (the even result's high half down, the odd one's kept), plus the carry
    // out of the low halves (lined up the same way) + 0x7FFF + the truncation's lowest bit, which
    // is bit 15 of vpavgw(low, 0x7FFE | bit) = (low + 0x7FFF + bit) >> 1 (a 17-bit sum). Without
    // float_to_bf16's NaN select: every NaN here has 16 low zero bits (a bf16 source's NaN,
    // quieted by the add, or Inf - Inf's default NaN; a noise term is never NaN, a NaN std goes
    // to the scalar code), which get no carry, and is quiet already.
    const __m256i even_bits = _mm256_castps_si256(even_out);
    const __m256i odd_bits = _mm256_castps_si256(odd_out);
    const __m256i truncated = _mm256_blend_epi16(_mm256_srli_epi32(even_bits, 16), odd_bits, 0xAA);
    const __m256i dropped = _mm256_blend_epi16(even_bits, _mm256_slli_epi32(odd_bits, 16), 0xAA);
    const __m256i bias = _mm256_or_si256(_mm256_and_si256(truncated, _mm256_set1_epi16(1)),
                                         _mm256_set1_epi16(0x7FFE));
    const __m256i carry = _mm256_srli_epi16(_mm256_avg_epu16(dropped, bias), 15);
    vector_store<kStream>(dst, _mm256_add_epi16(truncated, carry));
  }
}

}  // namespace draftfeed

#endif
