// FP8 E4M3: the conversions on the format's landmarks (torch is the oracle for all codes in
// tests/python/test_fp8_codes.py), and the batch copy over FP8 rows against its scalar definition
// (batch/fp8_dequantize.h) for every code, every dequantize dtype, both batch dtypes, with and
// without noise: the reference a vectorised kernel must keep matching.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "avx512_allowed.h"
#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/batch/noise.h"
#include "draftfeed/common/fp8.h"
#include "guarded_row.h"

namespace draftfeed {
namespace {

TEST(Fp8Test, LandmarkCodes) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_float(0x80)));
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x39), 1.125f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
  EXPECT_TRUE(fp8_e4m3_is_nan(0xFF) && !fp8_e4m3_is_nan(0xFE));
}

TEST(Fp8Test, EveryFiniteCodeRoundTripsAndOrderIsKept) {
  float previous = -1.0f;
  for (unsigned code = 0; code < 0x7F; ++code) {
    const float value = fp8_e4m3_to_float(static_cast<std::uint8_t>(code));
    EXPECT_EQ(float_to_fp8_e4m3(value), code);
    EXPECT_EQ(float_to_fp8_e4m3(-value), code | 0x80);
    EXPECT_GT(value, previous);
    previous = value;
  }
}

TEST(Fp8Test, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);   // tie between 1 and 1.125: even
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3A);   // tie between 1.125 and 1.25: even
  EXPECT_EQ(float_to_fp8_e4m3(1.0626f), 0x39);   // just above the tie
  EXPECT_EQ(float_to_fp8_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: even (0)
  EXPECT_EQ(float_to_fp8_e4m3(0x3p-10f), 0x02);  // tie between 1 and 2 subnormal steps
  EXPECT_EQ(float_to_fp8_e4m3(0x1p-30f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3(0x1.ep-7f), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(float_to_fp8_e4m3(464.0f), 0x7E);     // tie between 448 and 480: 448
  EXPECT_EQ(float_to_fp8_e4m3(470.0f), 0x7E);     // saturates, as torch's cast
  EXPECT_EQ(float_to_fp8_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_fp8_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(Fp8Test, DequantizeRoundsOnceInTheDequantizeDtype) {
  // bf16(1.125) x bf16(scale) with scale = 1 + 2^-7 + 2^-9: the scale rounds to 1 + 2^-7 in bf16,
  // the product 1.125 x (1 + 2^-7) = 1.1337890625 rounds to bf16 1.1328125.
  const float scale = 1.0f + 0x1p-7f + 0x1p-9f;
  EXPECT_EQ(dequantize_fp8(0x39, scale, DType::kBF16), 1.1328125f);
  EXPECT_EQ(dequantize_fp8(0x39, scale, DType::kF32), 1.125f * scale);
  // f16 keeps the scale, and rounds the product 1.1359863... to 11 bits: 1163 x 2^-10.
  EXPECT_EQ(dequantize_fp8(0x39, scale, DType::kF16), 1163.0f * 0x1p-10f);
  EXPECT_TRUE(std::isinf(dequantize_fp8(0x7E, 1e36f, DType::kBF16)));
  EXPECT_TRUE(std::isinf(dequantize_fp8(0x7E, 1e3f, DType::kF16)));
  EXPECT_TRUE(std::isnan(dequantize_fp8(0x7F, 1.0f, DType::kF32)));
}

// Rows of all 256 codes (rotated per row so each position sees every code), one scale per row;
// in odd rows the NaN codes are replaced by the largest finite ones, so the kernels' ways for rows
// without NaN codes (fp8_bf16_row.h, fp8_noise_row.h) are taken too.
struct Fp8Rows {
  static constexpr std::int64_t kWidth = 259;  // odd: the kernels' pair loops have a tail
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;

  Fp8Rows() {
    for (const float s : {1e-12f, 1.0f / 448, 0.37f, 1.0f, 3.0f + 0x1p-8f, 1e-40f, 5e4f, 1e36f}) {
      scales.push_back(s);
    }
    for (std::size_t r = 0; r < scales.size(); ++r) {
      for (std::int64_t i = 0; i < kWidth; ++i) {
        const auto code = static_cast<std::uint8_t>((static_cast<std::size_t>(i) + 37 * r) & 0xFF);
        codes.push_back(r % 2 == 1 && fp8_e4m3_is_nan(code) ? code - 1 : code);
      }
    }
  }
  std::int64_t rows() const { return static_cast<std::int64_t>(scales.size()); }
};

float stored(const GuardedRow& out, DType dst, std::size_t i) {
  if (dst == DType::kF32) {
    float v;
    std::memcpy(&v, out.data() + 4 * i, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, out.data() + 2 * i, 2);
  return bf16_to_float(bits);
}

float in_batch_dtype(float value, DType dst) {
  return dst == DType::kF32 ? value : bf16_to_float(float_to_bf16(value));
}

bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

class Fp8CopyTest : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(Fp8CopyTest, EqualsTheScalarDefinition) {
  const auto [dequantize, dst] = GetParam();
  const Fp8Rows data;
  const std::int64_t n = data.rows() * Fp8Rows::kWidth;
  // The uniform noise cases with the AVX-512 kernels allowed (where the CPU has them) and not.
  struct Case {
    NoiseKind noise;
    bool aligned;
    bool avx512;
  };
  for (const auto& [noise, aligned, avx512] :
       {Case{NoiseKind::kNone, true, true}, Case{NoiseKind::kNone, false, true},
        Case{NoiseKind::kUniform, true, true}, Case{NoiseKind::kUniform, false, true},
        Case{NoiseKind::kUniform, true, false}, Case{NoiseKind::kUniform, false, false}}) {
    const Avx512Allowed allowed(avx512);
    // Aligned rows are written with streaming stores, others normally (vector_store.h).
    GuardedRow out(static_cast<std::size_t>(n) * dtype_size(dst), aligned);
    RowCopy job;
    job.src = data.codes.data();
    job.src_dtype = DType::kF8E4M3;
    job.src_row_stride = Fp8Rows::kWidth;
    job.src_scales = reinterpret_cast<const std::uint8_t*>(data.scales.data());
    job.dequantize = dequantize;
    job.dst = out.data();
    job.dst_dtype = dst;
    job.dst_row_stride = Fp8Rows::kWidth;
    job.rows = data.rows();
    job.width = Fp8Rows::kWidth;
    job.noise = noise;
    job.noise_std = 0.05f;
    job.noise_sample_key = 77;
    job.first_token = 5;
    job.stores = RowStores::kStreamed;  // where the row is aligned (vector_store.h)
    const std::int64_t nonfinite = copy_hidden_rows(job);

    std::int64_t expected_nonfinite = 0;
    for (std::int64_t r = 0; r < data.rows(); ++r) {
      const std::uint32_t key = noise_token_key(77, static_cast<std::uint64_t>(5 + r));
      for (std::int64_t i = 0; i < Fp8Rows::kWidth; ++i) {
        const auto k = static_cast<std::size_t>(r * Fp8Rows::kWidth + i);
        const float value =
            dequantize_fp8(data.codes[k], data.scales[static_cast<std::size_t>(r)], dequantize);
        expected_nonfinite += !std::isfinite(value);
        float with_noise = value;
        if (noise == NoiseKind::kUniform) {
          const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(i / 2));
          with_noise += (i % 2 == 0 ? noise_signed_low(bits) : noise_signed_high(bits)) * 0.05f;
        }
        const float want = in_batch_dtype(with_noise, dst);
        ASSERT_TRUE(same(stored(out, dst, k), want))
            << "row " << r << " code " << int{data.codes[k]} << ": " << stored(out, dst, k)
            << " != " << want;
      }
    }
    EXPECT_EQ(nonfinite, expected_nonfinite);
    EXPECT_GE(nonfinite, data.rows());  // the NaN codes of the even rows at least
    EXPECT_TRUE(out.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(EveryDequantizeAndBatchDtype, Fp8CopyTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16,
                                                              DType::kF32),
                                            ::testing::Values(DType::kBF16, DType::kF32)));

}  // namespace
}  // namespace draftfeed
