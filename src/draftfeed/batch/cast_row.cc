#include "draftfeed/batch/cast_row.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "draftfeed/batch/vector_lanes.h"
#include "draftfeed/batch/vector_store.h"
#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/hidden_value.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>
#endif

namespace draftfeed {

namespace {

// The scalar definitions, for the tails (and the whole row where AVX2 is not).
bool nonfinite_bits(const std::uint8_t* src, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return hidden_value_nonfinite<DType::kF32>(src, i);
    case DType::kF16:
      return hidden_value_nonfinite<DType::kF16>(src, i);
    default:
      return hidden_value_nonfinite<DType::kBF16>(src, i);
  }
}

std::int64_t scalar_copy(const std::uint8_t* src, DType dtype, std::uint8_t* dst,
                         std::int64_t first, std::int64_t n) {
  if (n <= first) return 0;  // an empty row may have null pointers, which memcpy must not get
  const std::size_t size = dtype_size(dtype);
  std::memcpy(dst + first * size, src + first * size, static_cast<std::size_t>(n - first) * size);
  std::int64_t bad = 0;
  for (std::int64_t i = first; i < n; ++i) bad += nonfinite_bits(src, dtype, i);
  return bad;
}

std::int64_t scalar_cast(const std::uint8_t* src, DType src_dtype, std::uint8_t* dst,
                         std::int64_t first, std::int64_t n) {
  std::int64_t bad = 0;
  for (std::int64_t i = first; i < n; ++i) {
    const float value = src_dtype == DType::kF32 ? load_hidden_value<DType::kF32>(src, i)
                                                 : load_hidden_value<DType::kF16>(src, i);
    const std::uint16_t out = float_to_bf16(value);
    std::memcpy(dst + 2 * i, &out, 2);
    bad += nonfinite_bits(src, src_dtype, i);
  }
  return bad;
}

}  // namespace

#if defined(DRAFTFEED_X86)

bool cast_row_avx2_available() { return cpu_has_avx2_f16c(); }

namespace {

// Per-lane non-finite counts, summed into `count` every 2^15 blocks of 32 bytes (a 16-bit lane
// counts at most one per block, so it cannot wrap before).
constexpr std::int64_t kBlocksPerSum = std::int64_t{1} << 15;

// 32 bytes from `src` to `dst`; lanes whose exponent bits (`mask`, 16- or 32-bit lanes) are all
// ones add one to `bad` (cmpeq gives all ones = -1 in the lane; a 32-bit lane's -1 is two 16-bit
// -1s, so its count is read as half the 16-bit sum).
template <bool kWide, bool kStream>
__attribute__((target("avx2"))) inline __m256i copy32(const std::uint8_t* src, std::uint8_t* dst,
                                                      __m256i mask, __m256i bad) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  vector_store<kStream>(dst, v);
  const __m256i exponent = _mm256_and_si256(v, mask);
  const __m256i hit =
      kWide ? _mm256_cmpeq_epi32(exponent, mask) : _mm256_cmpeq_epi16(exponent, mask);
  return _mm256_sub_epi16(bad, hit);
}

template <bool kWide, bool kStream>
__attribute__((target("avx2"))) std::int64_t copy_avx2(const std::uint8_t* src, DType dtype,
                                                       std::uint8_t* dst, std::int64_t n) {
  const std::int64_t size = kWide ? 4 : 2;
  const std::int64_t per_block = 32 / size;
  const __m256i mask = kWide ? _mm256_set1_epi32(0x7F800000)
                             : _mm256_set1_epi16(dtype == DType::kF16 ? 0x7C00 : 0x7F80);
  std::int64_t count = 0;
  std::int64_t i = 0;
  while (i + 2 * per_block <= n) {
    __m256i bad = _mm256_setzero_si256();
    const std::int64_t stop = std::min(n - 2 * per_block + 1, i + kBlocksPerSum * per_block);
    for (; i < stop; i += 2 * per_block) {  // two blocks per step: a 64-byte cache line
      bad = copy32<kWide, kStream>(src + i * size, dst + i * size, mask, bad);
      bad = copy32<kWide, kStream>(src + (i + per_block) * size, dst + (i + per_block) * size, mask,
                                   bad);
    }
    count += kWide ? sum_u16_lanes(bad) / 2 : sum_u16_lanes(bad);
  }
  vector_kernel_done<kStream>();
  return count + scalar_copy(src, dtype, dst, i, n);
}

// float_to_bf16 (dtype.h) on 8 floats' bits: the bf16 in the low half of each 32-bit lane.
// kNaN: a NaN is quieted and truncated, as the scalar definition does it (round_to_bf16_low could
// carry a NaN's payload into its exponent and sign).
template <bool kNaN>
__attribute__((target("avx2"))) inline __m256i bf16_of(__m256i bits) {
  if constexpr (!kNaN) return round_to_bf16_low(bits);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
}

template <bool kStream>
__attribute__((target("avx2"))) std::int64_t cast_f32_avx2(const std::uint8_t* src,
                                                           std::uint8_t* dst, std::int64_t n) {
  const __m256i mask = _mm256_set1_epi32(0x7F800000);
  // 32-bit lanes count up to 2^31 - 1: a row is far shorter.
  __m256i bad = _mm256_setzero_si256();
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i));
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i + 32));
    bad = _mm256_sub_epi32(bad, _mm256_cmpeq_epi32(_mm256_and_si256(low, mask), mask));
    bad = _mm256_sub_epi32(bad, _mm256_cmpeq_epi32(_mm256_and_si256(high, mask), mask));
    vector_store<kStream>(dst + 2 * i, pack_bf16(bf16_of<true>(low), bf16_of<true>(high)));
  }
  alignas(32) std::int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bad);
  vector_kernel_done<kStream>();
  std::int64_t count = 0;
  for (const std::int32_t lane : lanes) count += lane;
  return count + scalar_cast(src, DType::kF32, dst, i, n);
}

// float_to_bf16(f16 value) for 16 normal f16 values (exponent 1-30), in 16-bit integer lanes:
// the 10-bit mantissa rounded to 7 bits to nearest even (a carry goes into the exponent, as in
// float's round; it never reaches the sign), then shifted right by 3 with the sign copied into
// the three bits it frees, which the mask clears, and the exponent rebiased from 15 to 127.
// Exact: a normal f16 is a normal float with 13 low zero bits.
struct NormalF16Constants {
  __m256i one = _mm256_set1_epi16(1);
  __m256i three = _mm256_set1_epi16(3);
  __m256i keep = _mm256_set1_epi16(static_cast<short>(0x8FFF));
  __m256i bias = _mm256_set1_epi16((127 - 15) << 7);
};
__attribute__((target("avx2"))) inline __m256i bf16_of_normal_f16(__m256i halves,
                                                                  const NormalF16Constants& c) {
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(halves, 3), c.one);
  const __m256i rounded = _mm256_add_epi16(_mm256_add_epi16(halves, c.three), odd);
  const __m256i shifted = _mm256_and_si256(_mm256_srai_epi16(rounded, 3), c.keep);
  return _mm256_add_epi16(shifted, c.bias);
}

// Hides `value` from the optimiser, so that a loop keeps a constant in a register: GCC otherwise
// rebuilds some broadcast constants in every iteration (a move and a broadcast each), and turns a
// compare with one into two instructions (a min and an equality).
__attribute__((target("avx2"))) inline __m256i opaque(__m256i value) {
  __asm__("" : "+x"(value));
  return value;
}

// A block of 16 f16 values that are not all normal; returns its non-finite values. Those with a
// NaN by the scalar definition (quieting), the others (zeros, subnormals, infinities) through
// F16C's exact conversion to float and the float round. Out of line: a call in the main loop
// would make the compiler rebuild that loop's constants in every iteration.
template <bool kStream>
__attribute__((target("avx2,f16c"), noinline)) std::int64_t cast_special_f16_block(
    const std::uint8_t* src, std::uint8_t* dst) {
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m256i magnitude = _mm256_and_si256(halves, _mm256_set1_epi16(0x7FFF));
  const __m256i nonfinite = _mm256_cmpgt_epi16(magnitude, _mm256_set1_epi16(0x7BFF));
  const __m256i nan = _mm256_cmpgt_epi16(magnitude, _mm256_set1_epi16(0x7C00));
  if (!_mm256_testz_si256(nan, nan)) {
    return scalar_cast(src, DType::kF16, dst, 0, 16);
  }
  const __m256i low = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
  const __m256i high = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)));
  vector_store<kStream>(dst, pack_bf16(bf16_of<false>(low), bf16_of<false>(high)));
  // Two mask bits per 16-bit lane.
  return std::popcount(static_cast<unsigned>(_mm256_movemask_epi8(nonfinite))) / 2;
}

// f16 -> bf16. A block of 16 normal values (nearly every block of real hidden states) is
// converted in 16-bit integer lanes, and has nothing to count; the others go to
// cast_special_f16_block. One add and one signed compare tell them apart: the magnitude plus
// 0x7C00 is at most -2049 (as int16) exactly for exponents 1-30. Why not F16C and the float round
// for every block: with its NaN select and the count in every block that loop has twice the
// instructions of this one.
template <bool kStream>
__attribute__((target("avx2,f16c"))) std::int64_t cast_f16_avx2(const std::uint8_t* src,
                                                                std::uint8_t* dst, std::int64_t n) {
  std::int64_t count = 0;
  std::int64_t i = 0;
  while (i + 16 <= n) {
    const __m256i magnitude_mask = opaque(_mm256_set1_epi16(0x7FFF));
    const __m256i offset = opaque(_mm256_set1_epi16(0x7C00));
    const __m256i largest_normal = opaque(_mm256_set1_epi16(-2049));
    const NormalF16Constants constants{opaque(_mm256_set1_epi16(1)), opaque(_mm256_set1_epi16(3)),
                                       opaque(_mm256_set1_epi16(static_cast<short>(0x8FFF))),
                                       opaque(_mm256_set1_epi16((127 - 15) << 7))};
    for (; i + 16 <= n; i += 16) {  // no call in this loop
      const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
      const __m256i shifted = _mm256_add_epi16(_mm256_and_si256(halves, magnitude_mask), offset);
      const __m256i odd_one = _mm256_cmpgt_epi16(shifted, largest_normal);
      if (_mm256_movemask_epi8(odd_one) != 0) [[unlikely]]
        break;
      vector_store<kStream>(dst + 2 * i, bf16_of_normal_f16(halves, constants));
    }
    if (i + 16 > n) break;
    count += cast_special_f16_block<kStream>(src + 2 * i, dst + 2 * i);
    i += 16;
  }
  vector_kernel_done<kStream>();
  return count + scalar_cast(src, DType::kF16, dst, i, n);
}

}  // namespace

std::int64_t copy_row_avx2(const std::uint8_t* src, DType dtype, std::uint8_t* dst, std::int64_t n,
                           RowStores stores) {
  const bool stream = vector_store_streams(stores, dst);
  if (dtype == DType::kF32) {
    return stream ? copy_avx2<true, true>(src, dtype, dst, n)
                  : copy_avx2<true, false>(src, dtype, dst, n);
  }
  return stream ? copy_avx2<false, true>(src, dtype, dst, n)
                : copy_avx2<false, false>(src, dtype, dst, n);
}

std::int64_t cast_bf16_row_avx2(const std::uint8_t* src, DType src_dtype, std::uint8_t* dst,
                                std::int64_t n, RowStores stores) {
  const bool stream = vector_store_streams(stores, dst);
  if (src_dtype == DType::kF16) {
    return stream ? cast_f16_avx2<true>(src, dst, n) : cast_f16_avx2<false>(src, dst, n);
  }
  return stream ? cast_f32_avx2<true>(src, dst, n) : cast_f32_avx2<false>(src, dst, n);
}

#else

bool cast_row_avx2_available() { return false; }

std::int64_t copy_row_avx2(const std::uint8_t* src, DType dtype, std::uint8_t* dst, std::int64_t n,
                           RowStores /*stores*/) {
  return scalar_copy(src, dtype, dst, 0, n);
}

std::int64_t cast_bf16_row_avx2(const std::uint8_t* src, DType src_dtype, std::uint8_t* dst,
                                std::int64_t n, RowStores /*stores*/) {
  return scalar_cast(src, src_dtype, dst, 0, n);
}

#endif

}  // namespace draftfeed
