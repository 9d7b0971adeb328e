// The vectorised finiteness scan against a plain per-element reference, at every offset and length
// near the vector widths; the per-slot counts; the bf16/f16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/finite.h"

namespace draftfeed {
namespace {

// The obvious per-element answer, through float conversions (not the bit trick under test).
bool reference_all_finite(const std::uint8_t* p, std::size_t count, DType dtype) {
  for (std::size_t i = 0; i < count; ++i) {
    float value;
    if (dtype == DType::kF32) {
      std::memcpy(&value, p + 4 * i, 4);
    } else {
      std::uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      value = dtype == DType::kBF16 ? bf16_to_float(bits) : f16_to_float(bits);
    }
    if (!std::isfinite(value)) return false;
  }
  return true;
}

// `count` random finite elements starting `offset` bytes into the buffer (so misaligned), and a
// few more after them.
std::vector<std::uint8_t> finite_bytes(std::size_t count, std::size_t offset, DType dtype,
                                       std::mt19937& rng) {
  const std::size_t width = dtype == DType::kF32 ? 4 : 2;
  std::vector<std::uint8_t> out(offset + (count + 16) * width);
  std::uniform_real_distribution<float> dist(-60000.0f, 60000.0f);
  for (std::size_t i = 0; i < count + 16; ++i) {
    const float v = dist(rng);
    if (width == 4) {
      std::memcpy(&out[offset + i * 4], &v, 4);
    } else {
      const std::uint16_t bits = dtype == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
      std::memcpy(&out[offset + i * 2], &bits, 2);
    }
  }
  return out;
}

void put(std::uint8_t* p, DType dtype, float value) {
  if (dtype == DType::kF32) {
    std::memcpy(p, &value, 4);
  } else {
    const std::uint16_t bits = dtype == DType::kBF16 ? float_to_bf16(value) : float_to_f16(value);
    std::memcpy(p, &bits, 2);
  }
}

constexpr FiniteKernel kKernels[] = {FiniteKernel::kAuto, FiniteKernel::kScalar,
                                     FiniteKernel::kSse2, FiniteKernel::kAvx2};

class HiddenFiniteTest : public ::testing::TestWithParam<DType> {};

TEST_P(HiddenFiniteTest, AgreesWithTheReferenceAtEveryOffsetAndLength) {
  const DType dtype = GetParam();
  const std::size_t width = dtype == DType::kF32 ? 4 : 2;
  std::mt19937 rng(7);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (std::size_t count :
       {0u, 1u, 7u, 31u, 32u, 33u, 63u, 64u, 65u, 127u, 128u, 300u, 2049u, 5000u}) {
    for (std::size_t offset = 0; offset < 4; ++offset) {
      auto bytes = finite_bytes(count, offset, dtype, rng);
      std::uint8_t* base = bytes.data() + offset;
      ASSERT_TRUE(reference_all_finite(base, count, dtype));
      for (const auto kernel : kKernels) {
        EXPECT_TRUE(all_finite(base, count, dtype, kernel)) << count << " at +" << offset;
      }
      // One special value at each of a few positions, including the first and last element.
      for (std::size_t at : {std::size_t{0}, count / 2, count == 0 ? 0 : count - 1}) {
        if (count == 0) break;
        for (const float special : specials) {
          auto copy = bytes;
          put(copy.data() + offset + at * width, dtype, special);
          for (const auto kernel : kKernels) {
            EXPECT_FALSE(all_finite(copy.data() + offset, count, dtype, kernel))
                << count << " at +" << offset << ", special at " << at << ", kernel "
                << static_cast<int>(kernel);
          }
        }
      }
      // A special value just past the end is not looked at.
      put(base + count * width, dtype, specials[2]);
      for (const auto kernel : kKernels) EXPECT_TRUE(all_finite(base, count, dtype, kernel));
    }
  }
}

TEST_P(HiddenFiniteTest, LargestFiniteValuesAreFinite) {
  const DType dtype = GetParam();
  const std::size_t width = dtype == DType::kF32 ? 4 : 2;
  std::vector<std::uint8_t> bytes(width * 256);
  const float largest = dtype == DType::kF16    ? 65504.0f
                        : dtype == DType::kBF16 ? bf16_to_float(0x7F7F)
                                                : std::numeric_limits<float>::max();
  for (std::size_t i = 0; i < 256; ++i)
    put(bytes.data() + i * width, dtype, i % 2 ? largest : -largest);
  EXPECT_TRUE(all_finite(bytes.data(), 256, dtype));
}

TEST_P(HiddenFiniteTest, CountsNanAndInfPerSlot) {
  const DType dtype = GetParam();
  const std::size_t width = dtype == DType::kF32 ? 4 : 2;
  const std::int64_t rows = 5, slots = 4, hidden = 9;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * slots * hidden) * width);
  auto at = [&](std::int64_t r, std::int64_t s, std::int64_t h) {
    return bytes.data() + static_cast<std::size_t>((r * slots + s) * hidden + h) * width;
  };
  put(at(0, 1, 0), dtype, std::numeric_limits<float>::quiet_NaN());
  put(at(4, 1, 8), dtype, -std::numeric_limits<float>::quiet_NaN());
  put(at(2, 3, 4), dtype, std::numeric_limits<float>::infinity());
  put(at(3, 3, 4), dtype, -std::numeric_limits<float>::infinity());
  put(at(3, 3, 5), dtype, std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(all_finite(bytes.data(), bytes.size() / width, dtype));
  const auto counts = count_nonfinite_per_slot(bytes.data(), rows, slots, hidden, dtype);
  ASSERT_EQ(counts.size(), 4u);
  EXPECT_EQ(counts[0].total(), 0);
  EXPECT_EQ(counts[1].nan, 2);
  EXPECT_EQ(counts[1].inf, 0);
  EXPECT_EQ(counts[2].total(), 0);
  EXPECT_EQ(counts[3].nan, 1);
  EXPECT_EQ(counts[3].inf, 2);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HiddenFiniteTest,
                         ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(HiddenFiniteMiscTest, IntegersAreAlwaysFiniteAndF64IsChecked) {
  const std::vector<std::uint8_t> ones(64, 0xFF);
  EXPECT_TRUE(all_finite(ones.data(), 8, DType::kI64));
  EXPECT_FALSE(all_finite(ones.data(), 8, DType::kF64));  // all-ones is a NaN
  EXPECT_FALSE(finite_scan_supports(DType::kI32));
  EXPECT_TRUE(finite_scan_supports(DType::kBF16));
  EXPECT_FALSE(finite_scan_kernel().empty());
}

TEST(HiddenDtypeTest, NamesRoundTripInThePackagesOrder) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_name("bf16").has_value());
  EXPECT_EQ(dtype_name(DType::kU64), "U64");
  EXPECT_EQ(dtype_bits(DType::kF4), 4u);
  EXPECT_EQ(dtype_bits(DType::kC64), 64u);
  EXPECT_LT(DType::kF32, DType::kI64);  // the writer's sort relies on the declared order
}

TEST(HiddenDtypeTest, F16RoundTripsEveryNonNanPattern) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = f16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    EXPECT_EQ(float_to_f16(f), h) << std::hex << bits;
  }
}

TEST(HiddenDtypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3F82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(0x4080), 4.0f);
}

}  // namespace
}  // namespace draftfeed
