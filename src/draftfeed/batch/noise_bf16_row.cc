#include "draftfeed/batch/noise_bf16_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/vector_lanes.h"
#include "draftfeed/batch/vector_store.h"
#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/dtype.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>
#endif

namespace draftfeed {

namespace {

// One value by the scalar definition (hidden_copy.cc's row_uniform), for the tails.
template <bool kF32>
inline bool scalar_element(const std::uint8_t* src, std::uint8_t* dst, std::int64_t i, float draw,
                           float std_dev) {
  std::uint16_t in;
  std::memcpy(&in, src + 2 * i, 2);
  const float value = bf16_to_float(in) + draw * std_dev;
  if constexpr (kF32) {
    std::memcpy(dst + 4 * i, &value, 4);
  } else {
    const std::uint16_t out = float_to_bf16(value);
    std::memcpy(dst + 2 * i, &out, 2);
  }
  return (in & 0x7F80u) == 0x7F80u;
}

// Pairs from `first_pair` on, and the odd last value, as row_uniform does them.
template <bool kF32>
std::int64_t scalar_tail(const std::uint8_t* src, std::uint8_t* dst, std::int64_t first_pair,
                         std::int64_t n, std::uint32_t key, float std_dev) {
  std::int64_t bad = 0;
  const std::int64_t pairs = n / 2;
  for (std::int64_t k = first_pair; k < pairs; ++k) {
    const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(k));
    bad += scalar_element<kF32>(src, dst, 2 * k, noise_signed_low(bits), std_dev);
    bad += scalar_element<kF32>(src, dst, 2 * k + 1, noise_signed_high(bits), std_dev);
  }
  if (n % 2 != 0) {
    const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(pairs));
    bad += scalar_element<kF32>(src, dst, n - 1, noise_signed_low(bits), std_dev);
  }
  return bad;
}

}  // namespace

#if defined(DRAFTFEED_X86)

bool noise_bf16_row_avx2_available() { return cpu_has_avx2(); }

namespace {

// float_to_bf16 (dtype.h) on 8 floats, the bf16 bits in the high half of each 32-bit lane (the
// low half is garbage): round to nearest even by integer adds. Without float_to_bf16's NaN select:
// every NaN here has 16 low zero bits (a bf16 source's NaN, quieted by the add, or Inf - Inf's
// default NaN; the noise term is never NaN, the NaN scale goes to the scalar code), which the
// round leaves as they are, and is quiet already.
__attribute__((target("avx2"))) inline __m256i round_bf16_high(__m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
}

// kPrescaled: `scale` is std x 2^-31 (exact), else std (chosen in row, below).
template <bool kPrescaled>
__attribute__((target("avx2"))) inline __m256 noise_term(__m256i scaled_draw, __m256 scale) {
  __m256 draw = _mm256_cvtepi32_ps(scaled_draw);
  if constexpr (!kPrescaled) draw = _mm256_mul_ps(draw, _mm256_set1_ps(0x1p-31f));
  return _mm256_mul_ps(draw, scale);
}

template <bool kF32, bool kPrescaled, bool kStream>
__attribute__((target("avx2"))) std::int64_t row_avx2(const std::uint8_t* src, std::uint8_t* dst,
                                                      std::int64_t n, std::uint32_t key,
                                                      float std_dev) {
  const __m256 scale = _mm256_set1_ps(kPrescaled ? std_dev * 0x1p-31f : std_dev);
  const __m256i key8 = _mm256_set1_epi32(static_cast<int>(key));
  const __m256i high_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m256i exponent_mask = _mm256_set1_epi16(0x7F80);
  const __m256i half = _mm256_set1_epi32(0x8000);
  const __m256i sign_flip = _mm256_set1_epi32(static_cast<int>(0x80008000u));
  // counter x 0x9E3779B9 for the 8 pairs of a block, stepped by 8 x 0x9E3779B9 (mod 2^32, as
  // the scalar multiply wraps).
  __m256i counter = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                       _mm256_set1_epi32(static_cast<int>(0x9E3779B9u)));
  const __m256i step = _mm256_set1_epi32(static_cast<int>(8u * 0x9E3779B9u));
  const __m256i mix = _mm256_set1_epi32(0x7FEB352D);
  std::int64_t count = 0;
  std::int64_t i = 0;
  while (i + 16 <= n) {
    // Non-finite counts in 16-bit lanes, widened every 2^15 blocks (before they could wrap).
    __m256i bad = _mm256_setzero_si256();
    const std::int64_t stop = std::min(n - 15, i + (std::int64_t{1} << 19));
    for (; i < stop; i += 16) {
      // noise_bits (noise.h) for pairs i/2 .. i/2 + 7.
      __m256i x = _mm256_xor_si256(key8, counter);
      counter = _mm256_add_epi32(counter, step);
      x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
      x = _mm256_mullo_epi32(x, mix);
      x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
      // The draws x 2^31 as exact integers: for a 16-bit half u, noise_signed_low/high give
      // (u + 0.5) 2^-15 - 1 = (u - 32767.5) 2^-15, and (u - 32767.5) 2^16 is the 32-bit integer
      // with (u ^ 0x8000), read signed, in the high half and 0x8000 in the low half (17
      // significant bits: exact in float32).
      const __m256i flipped = _mm256_xor_si256(x, sign_flip);
      const __m256i low_draw = _mm256_or_si256(_mm256_slli_epi32(flipped, 16), half);
      const __m256i high_draw = _mm256_blend_epi16(flipped, half, 0x55);
      // Each 32-bit word is a pair: the even value in its low half, the odd one in its high half.
      const __m256i pair = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(pair, high_mask));
      const __m256 even_out = _mm256_add_ps(even, noise_term<kPrescaled>(low_draw, scale));
      const __m256 odd_out = _mm256_add_ps(odd, noise_term<kPrescaled>(high_draw, scale));
      if constexpr (kF32) {
        // unpack interleaves within 128-bit halves; permute2f128 puts values 0-7 and 8-15 together.
        const __m256 first = _mm256_unpacklo_ps(even_out, odd_out);   // 0 1 2 3 | 8 9 10 11
        const __m256 second = _mm256_unpackhi_ps(even_out, odd_out);  // 4 5 6 7 | 12 13 14 15
        vector_store<kStream>(dst + 4 * i,
                              _mm256_castps_si256(_mm256_permute2f128_ps(first, second, 0x20)));
        vector_store<kStream>(dst + 4 * i + 32,
                              _mm256_castps_si256(_mm256_permute2f128_ps(first, second, 0x31)));
      } else {
        // The even results' bf16 down to the low halves, the odd results' kept in the high ones.
        const __m256i packed = _mm256_blend_epi16(_mm256_srli_epi32(round_bf16_high(even_out), 16),
                                                  round_bf16_high(odd_out), 0xAA);
        vector_store<kStream>(dst + 2 * i, packed);
      }
      const __m256i exponent = _mm256_and_si256(pair, exponent_mask);
      bad = _mm256_sub_epi16(bad, _mm256_cmpeq_epi16(exponent, exponent_mask));
    }
    count += sum_u16_lanes(bad);
  }
  vector_stores_done<kStream>();
  return count + scalar_tail<kF32>(src, dst, i / 2, n, key, std_dev);
}

template <bool kF32>
std::int64_t row(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n, std::uint32_t key,
                 float std_dev, RowStores stores) {
  // A NaN scale (the batch spec refuses it) would make NaN noise terms with payloads: scalar.
  if (std::isnan(std_dev)) return scalar_tail<kF32>(src, dst, 0, n, key, std_dev);
  // std x 2^-31 is exact unless it is subnormal: then the draw is scaled back first (exact too).
  // Either way the product's real value, hence its float32 rounding, is draw x std's.
  const bool stream = vector_store_streams(stores, dst);
  if (std_dev == 0.0f || std::fabs(std_dev) >= 0x1p-95f) {
    return stream ? row_avx2<kF32, true, true>(src, dst, n, key, std_dev)
                  : row_avx2<kF32, true, false>(src, dst, n, key, std_dev);
  }
  return stream ? row_avx2<kF32, false, true>(src, dst, n, key, std_dev)
                : row_avx2<kF32, false, false>(src, dst, n, key, std_dev);
}

}  // namespace

std::int64_t noise_bf16_row_avx2(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                 std::uint32_t key, float std_dev, RowStores stores) {
  return row<false>(src, dst, n, key, std_dev, stores);
}

std::int64_t noise_bf16_f32_row_avx2(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                     std::uint32_t key, float std_dev, RowStores stores) {
  return row<true>(src, dst, n, key, std_dev, stores);
}

#else

bool noise_bf16_row_avx2_available() { return false; }

std::int64_t noise_bf16_row_avx2(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                 std::uint32_t key, float std_dev, RowStores /*stores*/) {
  return scalar_tail<false>(src, dst, 0, n, key, std_dev);
}

std::int64_t noise_bf16_f32_row_avx2(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                     std::uint32_t key, float std_dev, RowStores /*stores*/) {
  return scalar_tail<true>(src, dst, 0, n, key, std_dev);
}

#endif

}  // namespace draftfeed
