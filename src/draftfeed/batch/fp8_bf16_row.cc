#include "draftfeed/batch/fp8_bf16_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/vector_lanes.h"
#include "draftfeed/batch/vector_store.h"
#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fp8.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>
#endif

namespace draftfeed {

namespace {

// One element by the scalar definition, for the tails.
inline bool scalar_element(std::uint8_t code, float scale_bf16, std::uint8_t* dst) {
  const std::uint16_t bits = float_to_bf16(fp8_e4m3_to_float(code) * scale_bf16);
  std::memcpy(dst, &bits, 2);
  return (bits & 0x7F80u) == 0x7F80u;
}

}  // namespace

#if defined(DRAFTFEED_X86)

bool fp8_bf16_row_avx2_available() { return cpu_has_avx2_f16c(); }

namespace {

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

template <bool kPrescaled, bool kStream>
__attribute__((target("avx2,f16c"))) std::int64_t row_avx2(const std::uint8_t* codes,
                                                           float scale_bf16, std::uint8_t* dst,
                                                           std::int64_t n) {
  const __m256 scale = _mm256_set1_ps(kPrescaled ? scale_bf16 * 256.0f : scale_bf16);
  std::int64_t count = 0;
  std::int64_t i = 0;
  while (i + 16 <= n) {
    // Non-finite counts in 16-bit lanes, widened every 2^15 blocks (before they could wrap).
    __m256i bad = _mm256_setzero_si256();
    const std::int64_t stop = std::min(n - 15, i + (std::int64_t{1} << 19));
    for (; i < stop; i += 16) {
      const __m256i code =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
      // The code as f16 bits: sign to bit 15, exponent and mantissa up by 7 (f16 has one more
      // exponent bit and 7 more mantissa bits; its bias is 8 more), so f16 = code x 2^-8,
      // subnormals included. The NaN codes become f16 NaN (exponent all ones).
      const __m256i magnitude =
          _mm256_and_si256(_mm256_slli_epi16(code, 7), _mm256_set1_epi16(0x3F80));
      const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(code, 8),
                                            _mm256_set1_epi16(static_cast<short>(0x8000)));
      const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(magnitude, _mm256_set1_epi16(0x3F80)),
                                           _mm256_set1_epi16(0x7C00));
      const __m256i halves = _mm256_or_si256(_mm256_or_si256(magnitude, sign), nan);
      const __m256i low = dequantize8<kPrescaled>(_mm256_castsi256_si128(halves), scale);
      const __m256i high = dequantize8<kPrescaled>(_mm256_extracti128_si256(halves, 1), scale);
      const __m256i packed = pack_bf16(low, high);
      vector_store<kStream>(dst + 2 * i, packed);
      const __m256i exponent = _mm256_and_si256(packed, _mm256_set1_epi16(0x7F80));
      bad = _mm256_sub_epi16(bad, _mm256_cmpeq_epi16(exponent, _mm256_set1_epi16(0x7F80)));
    }
    count += sum_u16_lanes(bad);
  }
  vector_stores_done<kStream>();
  for (; i < n; ++i) count += scalar_element(codes[i], scale_bf16, dst + 2 * i);
  return count;
}

// The 32 bf16 results a table row (below) looks its codes up in, as four 16-byte vpshufb tables
// (each in both 128-bit lanes) indexed by a code's low 4 bits (its exponent's lowest bit and its
// mantissa): the low and high bytes of the results of codes 0x00-0x0F (exponent 0 or 1: the
// subnormal codes and the smallest normal ones), and of codes 0x10-0x1F (exponent 2 or 3) with 1
// taken off the high byte. Computed by the vector block above.
struct CodeTables {
  __m256i small_low, small_high, general_low, general_high;
};

__attribute__((target("avx2,f16c"))) inline CodeTables code_tables(__m256 scale_x256) {
  // Codes 0-15 and 16-31 in f16's layout (positive codes: the code shifted up by 7).
  const __m256i first =
      _mm256_slli_epi16(_mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 7);
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
  return {_mm256_permute2x128_si256(lows, lows, 0x00),
          _mm256_permute2x128_si256(highs, highs, 0x00),
          _mm256_permute2x128_si256(lows, lows, 0x11),
          _mm256_sub_epi8(_mm256_permute2x128_si256(highs, highs, 0x11), _mm256_set1_epi8(1))};
}

// A row whose scale is in [2^-119, 2^118), by table lookups, 32 codes per step. At such a scale
// every normal code's product is a normal float that rounds to a normal, finite bf16, and a code
// with its exponent 2 higher (the value times 4) has the result times 4 exactly (the product and
// both roundings scale with it). So a code with exponent e >= 2 has the result of the code 0x10-
// 0x1F with its low 4 bits, with e's upper 3 bits less 1 added to the high byte (the bf16
// exponent's upper 7 bits), and its sign flipped by the code's (dequantize(-c) = -dequantize(c):
// the round is symmetric); exponents 0 and 1 have their own entries. About 20 vector
// instructions per 32 values, against 44 for the direct computation (row_avx2). Returns false,
// `dst` partly written, if the row has a NaN code (the tables have no entry for one).
template <bool kStream>
__attribute__((target("avx2,f16c"))) bool table_row_avx2(const std::uint8_t* codes,
                                                         float scale_bf16, std::uint8_t* dst,
                                                         std::int64_t n) {
  const CodeTables tables = code_tables(_mm256_set1_ps(scale_bf16 * 256.0f));
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  const __m256i three_bits = _mm256_set1_epi8(0x07);
  const __m256i sign_bit = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i magnitude = _mm256_set1_epi8(0x7F);
  __m256i nan = _mm256_setzero_si256();
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // Quadwords 0 2 1 3: the in-lane unpacks below then give codes 0-15 and 16-31 in order.
    const __m256i code = _mm256_permute4x64_epi64(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)), 0xD8);
    const __m256i index = _mm256_and_si256(code, low_nibble);
    // The exponent's upper 3 bits (a 16-bit shift: the mask drops what crossed from the next byte).
    const __m256i upper = _mm256_and_si256(_mm256_srli_epi16(code, 4), three_bits);
    const __m256i small = _mm256_cmpeq_epi8(upper, _mm256_setzero_si256());
    const __m256i low = _mm256_blendv_epi8(_mm256_shuffle_epi8(tables.general_low, index),
                                           _mm256_shuffle_epi8(tables.small_low, index), small);
    const __m256i high = _mm256_xor_si256(
        _mm256_blendv_epi8(_mm256_add_epi8(_mm256_shuffle_epi8(tables.general_high, index), upper),
                           _mm256_shuffle_epi8(tables.small_high, index), small),
        _mm256_and_si256(code, sign_bit));
    nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_and_si256(code, magnitude), magnitude));
    vector_store<kStream>(dst + 2 * i, _mm256_unpacklo_epi8(low, high));
    vector_store<kStream>(dst + 2 * i + 32, _mm256_unpackhi_epi8(low, high));
  }
  vector_stores_done<kStream>();
  if (!_mm256_testz_si256(nan, nan)) return false;
  for (; i < n; ++i) {
    if (fp8_e4m3_is_nan(codes[i])) return false;
    scalar_element(codes[i], scale_bf16, dst + 2 * i);
  }
  return true;
}

}  // namespace

std::int64_t fp8_bf16_row_avx2(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                               std::int64_t n, RowStores stores) {
  const bool stream = vector_store_streams(stores, dst);
  const float magnitude = std::fabs(scale_bf16);
  if (magnitude >= 0x1p-119f && magnitude < 0x1p118f) {
    const bool done = stream ? table_row_avx2<true>(codes, scale_bf16, dst, n)
                             : table_row_avx2<false>(codes, scale_bf16, dst, n);
    if (done) return 0;  // no NaN code, and no product can overflow
  }
  // The scale x 2^8 must stay finite for the one-multiply form.
  if (std::fabs(scale_bf16) < 0x1p119f) {
    return stream ? row_avx2<true, true>(codes, scale_bf16, dst, n)
                  : row_avx2<true, false>(codes, scale_bf16, dst, n);
  }
  return stream ? row_avx2<false, true>(codes, scale_bf16, dst, n)
                : row_avx2<false, false>(codes, scale_bf16, dst, n);
}

#else

bool fp8_bf16_row_avx2_available() { return false; }

std::int64_t fp8_bf16_row_avx2(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                               std::int64_t n, RowStores /*stores*/) {
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) count += scalar_element(codes[i], scale_bf16, dst + 2 * i);
  return count;
}

#endif

}  // namespace draftfeed
