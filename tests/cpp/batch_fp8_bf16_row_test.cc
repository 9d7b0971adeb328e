// The AVX2 kernel for FP8 dequantized in bf16 into a bf16 batch (batch/fp8_bf16_row.h), called
// directly, against the scalar definition (batch/fp8_dequantize.h) bit for bit: every code, at
// every position of the 16-wide blocks and of the scalar tail, times scales across bf16's range
// (subnormal, tiny, ordinary, negative, zero, around the 2^119 switch to two multiplies, large
// enough to overflow to Inf, Inf, NaN), and its count of non-finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "draftfeed/batch/fp8_bf16_row.h"
#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fp8.h"
#include "guarded_row.h"

namespace draftfeed {
namespace {

TEST(Fp8Bf16RowTest, EqualsTheScalarDefinitionBitForBit) {
  if (!fp8_bf16_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> scales = {1e-40f,
                                     0x1p-133f,
                                     1e-12f,
                                     1.0f / 448,
                                     0.37f,
                                     1.0f,
                                     -0.37f,
                                     0.0f,
                                     -0.0f,
                                     3.0f + 0x1p-8f,
                                     5e4f,
                                     1e36f,
                                     0x1.fep117f,
                                     0x1p118f,
                                     0x1.fep118f,
                                     0x1p119f,
                                     0x1.02p119f,
                                     -0x1p120f,
                                     0x1p125f,
                                     3e38f,
                                     inf,
                                     -inf,
                                     std::numeric_limits<float>::quiet_NaN()};
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{5}, std::int64_t{16},
                               std::int64_t{256 + 16 + 7}, std::int64_t{1000}}) {
    for (std::size_t s = 0; s < 2 * scales.size(); ++s) {
      // Each scale to an aligned row (streaming stores) and to an unaligned one.
      const bool aligned = s < scales.size();
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < codes.size(); ++i) {
        codes[i] = static_cast<std::uint8_t>((i + 53 * s) & 0xFF);
      }
      const float scale = round_to_dtype<DType::kBF16>(scales[s % scales.size()]);
      GuardedRow out(2 * codes.size(), aligned);
      const std::int64_t bad =
          fp8_bf16_row_avx2(codes.data(), scale, out.data(), n, RowStores::kStreamed);
      std::int64_t want_bad = 0;
      for (std::size_t i = 0; i < codes.size(); ++i) {
        const float want = dequantize_fp8<DType::kBF16>(codes[i], scale);
        want_bad += !std::isfinite(want);
        std::uint16_t got;
        std::memcpy(&got, out.data() + 2 * i, 2);
        const std::uint16_t want_bits = float_to_bf16(want);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(bf16_to_float(got))) << "code " << int{codes[i]} << " x " << scale;
        } else {
          ASSERT_EQ(got, want_bits) << "code " << int{codes[i]} << " x " << scale << " (n " << n
                                    << ", position " << i << ")";
        }
      }
      EXPECT_EQ(bad, want_bad) << "scale " << scale << ", n " << n;
      EXPECT_TRUE(out.guards_intact()) << "scale " << scale << ", n " << n;
    }
  }
}

// Rows without NaN codes, at scales in [2^-119, 2^118), take the kernel's table path (each
// result looked up from 32 computed ones, by its code's low 4 bits, its exponent's upper bits
// added); scales outside it, the direct one: every finite code at every position of the 32-code
// steps and of the tail, scales at and beside both ends of the range, against the definition.
TEST(Fp8Bf16RowTest, RowsWithoutNanCodesEqualTheDefinitionAtEveryPosition) {
  if (!fp8_bf16_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  std::vector<std::uint8_t> finite;
  for (unsigned code = 0; code < 256; ++code) {
    if (!fp8_e4m3_is_nan(static_cast<std::uint8_t>(code)))
      finite.push_back(static_cast<std::uint8_t>(code));
  }
  for (const float raw :
       {1e-40f, 0x1.fep-120f, 0x1p-119f, -0x1p-119f, 0x1.02p-119f, 1e-12f, 1.0f / 448, 0.37f, -1.0f,
        3.0f + 0x1p-8f, 0.0f, 5e4f, -0x1.fep117f, 0x1.fep117f, 0x1p118f}) {
    const float scale = round_to_dtype<DType::kBF16>(raw);
    for (std::size_t shift = 0; shift < 32; ++shift) {
      const auto n = static_cast<std::int64_t>(finite.size() + shift);
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = finite[(i + shift) % finite.size()];
      for (const bool aligned : {true, false}) {
        GuardedRow out(2 * codes.size(), aligned);
        EXPECT_EQ(fp8_bf16_row_avx2(codes.data(), scale, out.data(), n, RowStores::kStreamed), 0);
        for (std::size_t i = 0; i < codes.size(); ++i) {
          std::uint16_t got;
          std::memcpy(&got, out.data() + 2 * i, 2);
          ASSERT_EQ(got, float_to_bf16(dequantize_fp8<DType::kBF16>(codes[i], scale)))
              << "code " << int{codes[i]} << " x " << scale << " at " << i;
        }
        EXPECT_TRUE(out.guards_intact());
      }
    }
  }
}

// One NaN code anywhere in an otherwise finite row (in a 32-code step or in the tail) sends the
// row from the table path (which has no entry for it) to the direct one: every value is still the
// definition's, and the NaN is counted once.
TEST(Fp8Bf16RowTest, ANanCodeAnywhereInARowIsDequantizedAndCounted) {
  if (!fp8_bf16_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  const float scale = round_to_dtype<DType::kBF16>(0.37f);
  const std::int64_t n = 3 * 32 + 9;
  for (std::int64_t at = 0; at < n; ++at) {
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < codes.size(); ++i)
      codes[i] = static_cast<std::uint8_t>((7 * i) % 0x7F);
    codes[static_cast<std::size_t>(at)] = at % 2 == 0 ? 0x7F : 0xFF;
    GuardedRow out(2 * codes.size(), true);
    EXPECT_EQ(fp8_bf16_row_avx2(codes.data(), scale, out.data(), n, RowStores::kStreamed), 1)
        << "NaN at " << at;
    for (std::size_t i = 0; i < codes.size(); ++i) {
      std::uint16_t got;
      std::memcpy(&got, out.data() + 2 * i, 2);
      const float want = dequantize_fp8<DType::kBF16>(codes[i], scale);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(bf16_to_float(got))) << "NaN at " << at;
      } else {
        ASSERT_EQ(got, float_to_bf16(want))
            << "code " << int{codes[i]} << " at " << i << ", NaN at " << at;
      }
    }
    EXPECT_TRUE(out.guards_intact());
  }
}

}  // namespace
}  // namespace draftfeed
