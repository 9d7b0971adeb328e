// FP8 E4M3 codes dequantized in bf16 (fp8_dequantize.h's definition) in AVX-512 lanes: a row's
// 128 positive codes' results in byte tables, looked up 64 codes at a time with vpermi2b
// (AVX512_VBMI), for the 512-bit kernel that adds uniform noise (fp8_noise_row_avx512.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "draftfeed/batch/vector_lanes_avx512.h"
#include "draftfeed/common/cpu_features.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// 64 bf16 values in two registers of 32, in order.
struct Bf16Blocks512 {
  __m512i first;   // values 0-31
  __m512i second;  // values 32-63
};

// The results of codes 0x00-0x7F at the row's scale, made by the direct computation (fp8_lanes.h's
// dequantize8 on 16 codes at a time: f16 -> float is exact, the product the scalar one) and split
// into their low and high bytes, 128 each, two zmm tables each: a lookup is one two-table byte
// permute per byte, indexed by a code's low 7 bits (vpermi2b ignores the 8th), and a negative
// code's result is its magnitude's with the sign flipped (dequantize(-c) = -dequantize(c): the
// round is symmetric). For a scale Fp8TableLookup::applies to, as in the AVX2 kernel: the bf16
// scale x 2^8 is then exact and finite, so the one-multiply form is the scalar product. NaN codes
// (0x7F, 0xFF) have no true entry: a lookup notes them (saw_nan), and what it gave for them is not
// their value. Made once per row: about 100 instructions, against 8 per 64 codes looked up.
class Fp8TableLookup512 {
 public:
  __attribute__((target(DRAFTFEED_AVX512_TARGET))) explicit Fp8TableLookup512(float scale_bf16) {
    const __m512 scale = _mm512_set1_ps(scale_bf16 * 256.0f);
    alignas(64) std::uint8_t lows[128];
    alignas(64) std::uint8_t highs[128];
    for (std::ptrdiff_t group = 0; group < 8; ++group) {
      // Codes 16g..16g+15 in f16's layout (a positive code shifted up by 7): fp8_lanes.h's
      // dequantize8<true>, 16 at a time.
      const __m256i halves = _mm256_slli_epi16(
          _mm256_add_epi16(_mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm256_set1_epi16(static_cast<short>(16 * group))),
          7);
      const __m512i bf16 = round_to_bf16_low512(_mm512_mul_ps(_mm512_cvtph_ps(halves), scale));
      _mm_store_si128(reinterpret_cast<__m128i*>(lows + 16 * group), _mm512_cvtepi32_epi8(bf16));
      _mm_store_si128(reinterpret_cast<__m128i*>(highs + 16 * group),
                      _mm512_cvtepi32_epi8(_mm512_srli_epi32(bf16, 8)));
    }
    low_[0] = _mm512_load_si512(lows);
    low_[1] = _mm512_load_si512(lows + 64);
    high_[0] = _mm512_load_si512(highs);
    high_[1] = _mm512_load_si512(highs + 64);
  }

  // The bf16 values of the 64 codes `code` (a row's codes in order).
  __attribute__((target(DRAFTFEED_AVX512_TARGET))) Bf16Blocks512 lookup(__m512i code) {
    // Qwords 0 4 1 5 2 6 3 7: the in-lane byte unpacks below then give codes 0-31 and 32-63 in
    // order (128-bit lane L of the first holds codes 8L..8L+7).
    const __m512i index = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), code);
    const __m512i low = _mm512_permutex2var_epi8(low_[0], index, low_[1]);
    // The high byte, its sign bit flipped by the code's (high ^ (index & 0x80)).
    const __m512i high =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high_[0], index, high_[1]), index,
                                  _mm512_set1_epi8(static_cast<char>(0x80)), 0x78);
    // A code doubled in 8 bits is 0xFE only for the NaN codes (Fp8TableLookup says why).
    doubled_max_ = _mm512_max_epu8(doubled_max_, _mm512_add_epi8(code, code));
    return {_mm512_unpacklo_epi8(low, high), _mm512_unpackhi_epi8(low, high)};
  }

  // Whether a lookup so far had a NaN code.
  __attribute__((target(DRAFTFEED_AVX512_TARGET))) bool saw_nan() const {
    return _mm512_cmpeq_epi8_mask(doubled_max_, _mm512_set1_epi8(static_cast<char>(0xFE))) != 0;
  }

 private:
  __m512i low_[2];
  __m512i high_[2];
  __m512i doubled_max_ = _mm512_setzero_si512();
};

}  // namespace draftfeed

#endif
