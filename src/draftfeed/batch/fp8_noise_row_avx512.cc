// The AVX-512 kernel for FP8 rows dequantized in bf16 plus uniform noise into a bf16 batch
// (fp8_noise_row.h): 64 codes per step looked up in the row's byte tables (fp8_lanes_avx512.h),
// noised in two blocks of 32 (noise_lanes_avx512.h); the row's last partial step with masked
// loads and stores.
// clang-format off: first, before anything else includes <immintrin.h> (the header says why).
#include "draftfeed/common/immintrin_avx512.h"
// clang-format on

#include <cmath>

#include "draftfeed/batch/fp8_lanes.h"
#include "draftfeed/batch/fp8_lanes_avx512.h"
#include "draftfeed/batch/fp8_noise_row.h"
#include "draftfeed/batch/noise_lanes.h"
#include "draftfeed/batch/noise_lanes_avx512.h"
#include "draftfeed/batch/vector_lanes.h"
#include "draftfeed/batch/vector_store.h"
#include "draftfeed/common/cpu_features.h"

namespace draftfeed {

#if defined(DRAFTFEED_X86)

bool fp8_noise_row_avx512_available() { return avx512_kernels_enabled(); }

namespace {

template <bool kPrescaled, bool kStream>
__attribute__((target(DRAFTFEED_AVX512_TARGET))) bool row_avx512(const std::uint8_t* codes,
                                                                 float scale_bf16,
                                                                 std::uint8_t* dst, std::int64_t n,
                                                                 std::uint32_t key, float std_dev) {
  Fp8TableLookup512 table(scale_bf16);
  UniformNoiseBlocks512<kPrescaled> noise(key, std_dev);
  std::int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    prefetch_ahead(codes + i, codes + n);
    const Bf16Blocks512 values = table.lookup(_mm512_loadu_si512(codes + i));
    store_noised512<kStream>(dst + 2 * i, values.first, noise.next());
    store_noised512<kStream>(dst + 2 * i + 64, values.second, noise.next());
  }
  if (i < n) {
    // Masked-off codes load as zero (not a NaN code, and cannot fault) and are not stored.
    const std::int64_t left = n - i;
    const __mmask64 lanes = left == 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    const Bf16Blocks512 values = table.lookup(_mm512_maskz_loadu_epi8(lanes, codes + i));
    store_noised512<kStream>(dst + 2 * i, values.first, noise.next(),
                             static_cast<__mmask32>(lanes));
    if (left > 32) {
      store_noised512<kStream>(dst + 2 * i + 64, values.second, noise.next(),
                               static_cast<__mmask32>(lanes >> 32));
    }
  }
  const bool saw_nan = table.saw_nan();
  vector_kernel_done<kStream>();
  return !saw_nan;
}

}  // namespace

bool fp8_noise_row_avx512(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                          std::int64_t n, std::uint32_t key, float std_dev, RowStores stores) {
  // As the AVX2 kernel: a scale its tables apply to and a std that is not NaN.
  if (!Fp8TableLookup::applies(scale_bf16) || std::isnan(std_dev)) return false;
  return with_noise_form(
      std_dev, vector_store_streams(stores, dst), [&]<bool kPrescaled, bool kStream>() {
        return row_avx512<kPrescaled, kStream>(codes, scale_bf16, dst, n, key, std_dev);
      });
}

#else

bool fp8_noise_row_avx512_available() { return false; }

bool fp8_noise_row_avx512(const std::uint8_t* /*codes*/, float /*scale_bf16*/,
                          std::uint8_t* /*dst*/, std::int64_t /*n*/, std::uint32_t /*key*/,
                          float /*std_dev*/, RowStores /*stores*/) {
  return false;
}

#endif

}  // namespace draftfeed
