// The AVX-512 kernel for bf16 rows plus uniform noise into a bf16 batch (noise_bf16_row.h): 32
// values per block in noise_lanes_avx512.h's lanes, the row's last partial block with masked
// loads and stores (no scalar tail).
// clang-format off: first, before anything else includes <immintrin.h> (the header says why).
#include "draftfeed/common/immintrin_avx512.h"
// clang-format on

#include <cmath>

#include "draftfeed/batch/noise_bf16_row.h"
#include "draftfeed/batch/noise_lanes.h"
#include "draftfeed/batch/noise_lanes_avx512.h"
#include "draftfeed/batch/vector_lanes.h"
#include "draftfeed/batch/vector_store.h"
#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/hidden_value.h"

namespace draftfeed {

#if defined(DRAFTFEED_X86)

bool noise_bf16_row_avx512_available() { return avx512_kernels_enabled(); }

namespace {

template <bool kPrescaled, bool kStream>
__attribute__((target(DRAFTFEED_AVX512_TARGET))) std::int64_t row_avx512(
    const std::uint8_t* src, std::uint8_t* dst, std::int64_t n, std::uint32_t key, float std_dev) {
  UniformNoiseBlocks512<kPrescaled> noise(key, std_dev);
  // The largest source magnitude seen, doubled, per 16-bit lane (noise_bf16_row.cc says why).
  __m512i largest = _mm512_setzero_si512();
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(src + 2 * i, src + 2 * n);
    const __m512i values = _mm512_loadu_si512(src + 2 * i);
    largest = _mm512_max_epu16(largest, _mm512_add_epi16(values, values));
    store_noised512<kStream>(dst + 2 * i, values, noise.next());
  }
  if (i < n) {
    // Masked-off lanes load as zero (and cannot fault) and are not stored.
    const auto lanes = static_cast<__mmask32>((std::uint64_t{1} << (n - i)) - 1);
    const __m512i values = _mm512_maskz_loadu_epi16(lanes, src + 2 * i);
    largest = _mm512_max_epu16(largest, _mm512_add_epi16(values, values));
    store_noised512<kStream>(dst + 2 * i, values, noise.next(), lanes);
  }
  const bool any_non_finite =
      _mm512_cmpge_epu16_mask(largest, _mm512_set1_epi16(static_cast<short>(0xFF00))) != 0;
  vector_kernel_done<kStream>();
  return any_non_finite ? count_nonfinite_values<DType::kBF16>(src, n) : 0;
}

}  // namespace

std::int64_t noise_bf16_row_avx512(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                   std::uint32_t key, float std_dev, RowStores stores) {
  // A NaN scale makes NaN noise terms with payloads, which the vector rounds do not keep: the
  // AVX2 kernel hands such a row to the scalar code.
  if (std::isnan(std_dev)) return noise_bf16_row_avx2(src, dst, n, key, std_dev, stores);
  return with_noise_form(std_dev, vector_store_streams(stores, dst),
                         [&]<bool kPrescaled, bool kStream>() {
                           return row_avx512<kPrescaled, kStream>(src, dst, n, key, std_dev);
                         });
}

#else

bool noise_bf16_row_avx512_available() { return false; }

std::int64_t noise_bf16_row_avx512(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                   std::uint32_t key, float std_dev, RowStores stores) {
  return noise_bf16_row_avx2(src, dst, n, key, std_dev, stores);
}

#endif

}  // namespace draftfeed
