// FP8 E4M3 codes dequantized in bf16 (fp8_dequantize.h's definition) in AVX2 lanes: the pieces
// the kernels that dequantize share, into a bf16 batch (fp8_bf16_row.cc) and with uniform noise
// added (fp8_noise_row.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "draftfeed/batch/vector_lanes.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// 8 E4M3 codes laid out as f16 bits (below) -> 8 bf16 results in the low half of each 32-bit
// lane. f16 -> float is exact, the value is the code's x 2^-8 (a normal float); kPrescaled: `scale`
// is the bf16 scale x 2^8 (exact, and the product's real value the same, so its float rounding
// is), else the value is first multiplied back by 2^8 (exact) and then by the bf16 scale.
template <bool kPrescaled>
__attribute__((target("avx2,f16c"))) inline __m256i dequantize8(__m128i halves, __m256 scale) {
  __m256 value = _mm256_cvtph_ps(halves);
  if constexpr (!kPrescaled) value = _mm256_mul_ps(value, _mm256_set1_ps(256.0f));
  const __m256i bits = _mm256_castps_si256(_mm256_mul_ps(value, scale));
  // Without float_to_bf16's NaN select: every NaN here (NaN codes, a NaN scale, Inf x 0) is quiet
  // with 16 low zero bits, which rounding leaves as they are.
  return round_to_bf16_low(bits);
}

// 32 bf16 values in two registers of 16 (each 32-bit word a pair, the even value in its low half).
struct Bf16Blocks {
  __m256i first;   // values 0-15
  __m256i second;  // values 16-31
};

// A row's codes looked up, 32 per step, in tables of the results of codes 0x00-0x1F at the row's
// scale, for a scale in [2^-119, 2^118) (applies()). At such a scale every normal code's product
// is a normal float that rounds to a normal, finite bf16, and a code with its exponent 2 higher
// (the value times 4) has the result times 4 exactly (the product and both roundings scale with
// it). So a code with exponent e >= 2 has the result of the code 0x10-0x1F with its low 4 bits,
// with e's upper 3 bits less 1 added to the high byte (the bf16 exponent's upper 7 bits), and its
// sign flipped by the code's (dequantize(-c) = -dequantize(c): the round is symmetric); exponents
// 0 and 1 have their own entries. The tables are four 16-byte vpshufb tables (each in both 128-bit
// lanes) indexed by a code's low 4 bits (its exponent's lowest bit and its mantissa): the low and
// high bytes of the results of codes 0x00-0x0F (the subnormal codes and the smallest normal ones)
// and of codes 0x10-0x1F with 1 taken off the high byte, made by dequantize8. About 20 vector
// instructions per 32 values, against 44 for the direct computation. NaN codes have no entry: a
// lookup notes them (saw_nan), and what it gave for them is not their value.
class Fp8TableLookup {
 public:
  static bool applies(float scale_bf16) {
    const float magnitude = std::fabs(scale_bf16);
    return magnitude >= 0x1p-119f && magnitude < 0x1p118f;
  }

  __attribute__((target("avx2,f16c"))) explicit Fp8TableLookup(float scale_bf16) {
    const __m256 scale_x256 = _mm256_set1_ps(scale_bf16 * 256.0f);
    // Codes 0-15 and 16-31 in f16's layout (positive codes: the code shifted up by 7).
    const __m256i first = _mm256_slli_epi16(
        _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 7);
    const __m256i second = _mm256_add_epi16(first, _mm256_set1_epi16(16 << 7));
    const __m256i small =
        pack_bf16(dequantize8<true>(_mm256_castsi256_si128(first), scale_x256),
                  dequantize8<true>(_mm256_extracti128_si256(first, 1), scale_x256));
    const __m256i general =
        pack_bf16(dequantize8<true>(_mm256_castsi256_si128(second), scale_x256),
                  dequantize8<true>(_mm256_extracti128_si256(second, 1), scale_x256));
    // packus puts 8 bytes of each operand in each 128-bit lane; the permute makes the first lane
    // small's 16 bytes and the second general's.
    const __m256i byte = _mm256_set1_epi16(0xFF);
    const __m256i lows = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(_mm256_and_si256(small, byte), _mm256_and_si256(general, byte)), 0xD8);
    const __m256i highs = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(_mm256_srli_epi16(small, 8), _mm256_srli_epi16(general, 8)), 0xD8);
    small_low_ = _mm256_permute2x128_si256(lows, lows, 0x00);
    small_high_ = _mm256_permute2x128_si256(highs, highs, 0x00);
    general_low_ = _mm256_permute2x128_si256(lows, lows, 0x11);
    general_high_ =
        _mm256_sub_epi8(_mm256_permute2x128_si256(highs, highs, 0x11), _mm256_set1_epi8(1));
  }

  // The bf16 values of the 32 codes at `codes`.
  __attribute__((target("avx2,f16c"))) Bf16Blocks lookup(const std::uint8_t* codes) {
    // Quadwords 0 2 1 3: the in-lane unpacks below then give codes 0-15 and 16-31 in order.
    const __m256i code =
        _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)), 0xD8);
    const __m256i index = _mm256_and_si256(code, _mm256_set1_epi8(0x0F));
    // The exponent's upper 3 bits (a 16-bit shift: the mask drops what crossed from the next byte).
    const __m256i upper = _mm256_and_si256(_mm256_srli_epi16(code, 4), _mm256_set1_epi8(0x07));
    const __m256i small = _mm256_cmpeq_epi8(upper, _mm256_setzero_si256());
    const __m256i low = _mm256_blendv_epi8(_mm256_shuffle_epi8(general_low_, index),
                                           _mm256_shuffle_epi8(small_low_, index), small);
    const __m256i high = _mm256_xor_si256(
        _mm256_blendv_epi8(_mm256_add_epi8(_mm256_shuffle_epi8(general_high_, index), upper),
                           _mm256_shuffle_epi8(small_high_, index), small),
        _mm256_and_si256(code, _mm256_set1_epi8(static_cast<char>(0x80))));
    // A code doubled in 8 bits (its sign shifted out) is 0xFE only for the NaN codes 0x7F and
    // 0xFF, the largest value it can be: the largest so far says whether one was seen.
    doubled_max_ = _mm256_max_epu8(doubled_max_, _mm256_add_epi8(code, code));
    return {_mm256_unpacklo_epi8(low, high), _mm256_unpackhi_epi8(low, high)};
  }

  // Whether a lookup so far had a NaN code.
  __attribute__((target("avx2"))) bool saw_nan() const {
    const __m256i nan = _mm256_cmpeq_epi8(doubled_max_, _mm256_set1_epi8(static_cast<char>(0xFE)));
    return _mm256_movemask_epi8(nan) != 0;
  }

 private:
  __m256i small_low_;
  __m256i small_high_;
  __m256i general_low_;
  __m256i general_high_;
  __m256i doubled_max_ = _mm256_setzero_si256();  // per byte, the largest code x 2 (mod 256)
};

}  // namespace draftfeed

#endif
