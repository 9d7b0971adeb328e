#include "draftfeed/batch/noise_bf16_row.h"

#include <cmath>

#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/noise_lanes.h"
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

// Values `first` to `n` by the scalar definition (hidden_copy.cc's row_uniform), counted as it
// counts them (on the source's bits).
template <bool kF32>
std::int64_t scalar_tail(const std::uint8_t* src, std::uint8_t* dst, std::int64_t first,
                         std::int64_t n, std::uint32_t key, float std_dev) {
  constexpr DType kDst = kF32 ? DType::kF32 : DType::kBF16;
  for (std::int64_t i = first; i < n; ++i) {
    const float value = load_hidden_value<DType::kBF16>(src, i);
    store_hidden_value<kDst>(dst, i, uniform_noised(value, key, i, std_dev));
  }
  return count_nonfinite_values<DType::kBF16>(src + 2 * first, n - first);
}

}  // namespace

#if defined(DRAFTFEED_X86)

bool noise_bf16_row_avx2_available() { return cpu_has_avx2(); }

namespace {

template <bool kF32, bool kPrescaled, bool kStream>
__attribute__((target("avx2"))) std::int64_t row_avx2(const std::uint8_t* src, std::uint8_t* dst,
                                                      std::int64_t n, std::uint32_t key,
                                                      float std_dev) {
  UniformNoiseBlocks<kPrescaled> noise(key, std_dev);
  // The largest source magnitude seen, doubled (the sign shifted out), per 16-bit lane: a
  // non-finite bf16 (exponent all ones) doubles to 0xFF00 or more, a finite one to less.
  __m256i largest = _mm256_setzero_si256();
  std::int64_t i = 0;
#pragma GCC unroll 2
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(src + 2 * i, src + 2 * n);
    const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    largest = _mm256_max_epu16(largest, _mm256_add_epi16(values, values));
    store_noised<kF32, kStream>(dst + (kF32 ? 4 : 2) * i, values, noise.next());
  }
  // Non-finite source values are rare (a row with one is dropped or fails): counted again, by the
  // definition, only in a row that has one.
  const bool any_non_finite =
      _mm256_movemask_epi8(_mm256_cmpeq_epi16(
          _mm256_max_epu16(largest, _mm256_set1_epi16(static_cast<short>(0xFF00))), largest)) != 0;
  vector_kernel_done<kStream>();
  const std::int64_t count = any_non_finite ? count_nonfinite_values<DType::kBF16>(src, i) : 0;
  return count + scalar_tail<kF32>(src, dst, i, n, key, std_dev);
}

template <bool kF32>
std::int64_t row(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n, std::uint32_t key,
                 float std_dev, RowStores stores) {
  // A NaN scale (the batch spec refuses it) would make NaN noise terms with payloads: scalar.
  if (std::isnan(std_dev)) return scalar_tail<kF32>(src, dst, 0, n, key, std_dev);
  return with_noise_form(std_dev, vector_store_streams(stores, dst),
                         [&]<bool kPrescaled, bool kStream>() {
                           return row_avx2<kF32, kPrescaled, kStream>(src, dst, n, key, std_dev);
                         });
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
