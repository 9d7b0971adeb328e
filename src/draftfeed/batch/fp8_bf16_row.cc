#include "draftfeed/batch/fp8_bf16_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/fp8_lanes.h"
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
  vector_kernel_done<kStream>();
  for (; i < n; ++i) count += scalar_element(codes[i], scale_bf16, dst + 2 * i);
  return count;
}

// A row whose scale Fp8TableLookup applies to, by its lookups. Returns false, `dst` partly
// written, if the row has a NaN code.
template <bool kStream>
__attribute__((target("avx2,f16c"))) bool table_row_avx2(const std::uint8_t* codes,
                                                         float scale_bf16, std::uint8_t* dst,
                                                         std::int64_t n) {
  Fp8TableLookup table(scale_bf16);
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const Bf16Blocks values = table.lookup(codes + i);
    vector_store<kStream>(dst + 2 * i, values.first);
    vector_store<kStream>(dst + 2 * i + 32, values.second);
  }
  const bool saw_nan = table.saw_nan();
  vector_kernel_done<kStream>();
  if (saw_nan) return false;
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
  if (Fp8TableLookup::applies(scale_bf16)) {
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
