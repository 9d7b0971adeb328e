#include "draftfeed/batch/fp8_noise_row.h"

#include <cmath>

#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/fp8_lanes.h"
#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/noise_lanes.h"
#include "draftfeed/batch/vector_lanes.h"
#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fp8.h"
#include "draftfeed/common/hidden_value.h"

namespace draftfeed {

#if defined(DRAFTFEED_X86)

bool fp8_noise_row_avx2_available() { return cpu_has_avx2_f16c(); }

namespace {

// Values `first` to `n` by the scalar definition. False at a NaN code.
template <bool kF32>
bool scalar_tail(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst, std::int64_t first,
                 std::int64_t n, std::uint32_t key, float std_dev) {
  for (std::int64_t j = first; j < n; ++j) {
    if (fp8_e4m3_is_nan(codes[j])) return false;
    const float value = dequantize_fp8<DType::kBF16>(codes[j], scale_bf16);
    store_hidden_value<kF32 ? DType::kF32 : DType::kBF16>(dst, j,
                                                          uniform_noised(value, key, j, std_dev));
  }
  return true;
}

template <bool kF32, bool kPrescaled, bool kStream>
__attribute__((target("avx2,f16c"))) bool row_avx2(const std::uint8_t* codes, float scale_bf16,
                                                   std::uint8_t* dst, std::int64_t n,
                                                   std::uint32_t key, float std_dev) {
  Fp8TableLookup table(scale_bf16);
  UniformNoiseBlocks<kPrescaled> noise(key, std_dev);
  constexpr std::int64_t kOut = kF32 ? 4 : 2;  // bytes per value written
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(codes + i, codes + n);
    const Bf16Blocks values = table.lookup(codes + i);
    store_noised<kF32, kStream>(dst + kOut * i, values.first, noise.next());
    store_noised<kF32, kStream>(dst + kOut * (i + 16), values.second, noise.next());
  }
  const bool saw_nan = table.saw_nan();
  vector_kernel_done<kStream>();
  if (saw_nan) return false;
  return scalar_tail<kF32>(codes, scale_bf16, dst, i, n, key, std_dev);
}

template <bool kF32>
bool row(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst, std::int64_t n,
         std::uint32_t key, float std_dev, RowStores stores) {
  return with_noise_form(
      std_dev, vector_store_streams(stores, dst), [&]<bool kPrescaled, bool kStream>() {
        return row_avx2<kF32, kPrescaled, kStream>(codes, scale_bf16, dst, n, key, std_dev);
      });
}

}  // namespace

bool fp8_noise_row_avx2(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                        std::int64_t n, std::uint32_t key, float std_dev, bool f32,
                        RowStores stores) {
  // A NaN std would make NaN noise terms with payloads, which the vector round does not keep.
  if (!Fp8TableLookup::applies(scale_bf16) || std::isnan(std_dev)) return false;
  return f32 ? row<true>(codes, scale_bf16, dst, n, key, std_dev, stores)
             : row<false>(codes, scale_bf16, dst, n, key, std_dev, stores);
}

#else

bool fp8_noise_row_avx2_available() { return false; }

bool fp8_noise_row_avx2(const std::uint8_t* /*codes*/, float /*scale_bf16*/, std::uint8_t* /*dst*/,
                        std::int64_t /*n*/, std::uint32_t /*key*/, float /*std_dev*/, bool /*f32*/,
                        RowStores /*stores*/) {
  return false;
}

#endif

}  // namespace draftfeed
