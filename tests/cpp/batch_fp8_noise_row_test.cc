// The AVX2 kernel for FP8 rows dequantized in bf16 plus uniform noise into a bf16 or f32 batch and
// the AVX-512 one into a bf16 batch (batch/fp8_noise_row.h), each called directly (the AVX-512 one
// skipped on a CPU without it), against the scalar definition (fp8_dequantize.h's value, then
// hidden_copy.cc's row_uniform, written out here from noise.h) bit for bit: every finite code at
// every position of the 32-code steps and of the tail, scales across the range the kernel takes and
// beside its ends, noise scales from none to large enough to overflow to Inf (and the tiny ones
// that take the kernel's other form of the noise term), several keys, bf16 and f32 batches, aligned
// and unaligned rows; and the rows it refuses (a NaN code anywhere, a scale outside its range, a
// NaN std), which the batch copy then takes another way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/fp8_noise_row.h"
#include "draftfeed/batch/noise.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fp8.h"
#include "guarded_row.h"
#include "vector_kernel_param.h"

namespace draftfeed {
namespace {

// Value j of the row by the definition, as float32 bits or as bf16 bits widened.
std::uint32_t want_value(std::uint8_t code, float scale_bf16, std::int64_t j, std::uint32_t key,
                         float std_dev, bool f32) {
  const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(j / 2));
  const float draw = j % 2 == 0 ? noise_signed_low(bits) : noise_signed_high(bits);
  const float value = dequantize_fp8<DType::kBF16>(code, scale_bf16) + draw * std_dev;
  if (!f32) return float_to_bf16(value);
  std::uint32_t out;
  std::memcpy(&out, &value, 4);
  return out;
}

class Fp8NoiseRowTest : public VectorKernelTest {
 protected:
  void SetUp() override {
    skip_unless_available(fp8_noise_row_avx2_available(), fp8_noise_row_avx512_available());
  }

  // Codes per step.
  std::size_t step() const { return GetParam() == VectorIsa::kAvx2 ? 32 : 64; }

  bool row(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst, std::int64_t n,
           std::uint32_t key, float std_dev, bool f32) const {
    if (GetParam() == VectorIsa::kAvx512) {
      return fp8_noise_row_avx512(codes, scale_bf16, dst, n, key, std_dev, RowStores::kStreamed);
    }
    return fp8_noise_row_avx2(codes, scale_bf16, dst, n, key, std_dev, f32, RowStores::kStreamed);
  }
};

INSTANTIATE_TEST_SUITE_P(Kernels, Fp8NoiseRowTest,
                         testing::Values(VectorIsa::kAvx2, VectorIsa::kAvx512), vector_isa_name);

std::uint32_t read_value(const std::uint8_t* base, std::int64_t j, bool f32) {
  std::uint32_t v = 0;
  std::memcpy(&v, base + (f32 ? 4 : 2) * j, f32 ? 4 : 2);
  return v;
}

std::vector<std::uint8_t> finite_codes() {
  std::vector<std::uint8_t> codes;
  for (unsigned code = 0; code < 256; ++code) {
    if (!fp8_e4m3_is_nan(static_cast<std::uint8_t>(code))) {
      codes.push_back(static_cast<std::uint8_t>(code));
    }
  }
  return codes;
}

TEST_P(Fp8NoiseRowTest, EqualsTheScalarDefinitionBitForBit) {
  const std::vector<std::uint8_t> finite = finite_codes();
  const std::vector<float> scales = {0x1p-119f, -0x1p-119f, 1e-12f, 1.0f / 448,
                                     0.37f,     -1.0f,      5e4f,   0x1.fep117f};
  const std::vector<float> stds = {0.0f, 0.05f, -0.3f, 1e38f, 3.4e38f, 0x1.fffffep-96f, 0x1p-149f};
  const std::vector<std::uint32_t> keys = {0u, 0xFFFFFFFFu,
                                           noise_token_key(noise_sample_key(7, 2, 11), 5)};
  for (const bool f32 : f32_cases()) {
    for (std::size_t c = 0; c < scales.size(); ++c) {
      const float scale = round_to_dtype<DType::kBF16>(scales[c]);
      for (std::size_t s = 0; s < stds.size(); ++s) {
        // Every finite code at every position of a step, over the runs of shifts; the widths
        // cover full steps only, a tail, and an odd last value.
        for (std::size_t shift = 0; shift < step(); shift += (s == 1 ? 1 : 7)) {
          const auto n = static_cast<std::int64_t>(finite.size() + shift);
          const std::uint32_t key = keys[(c + s + shift) % keys.size()];
          std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
          for (std::size_t i = 0; i < codes.size(); ++i) {
            codes[i] = finite[(i + shift) % finite.size()];
          }
          const bool aligned = shift % 2 == 0;
          GuardedRow out((f32 ? 4 : 2) * codes.size(), aligned);
          ASSERT_TRUE(row(codes.data(), scale, out.data(), n, key, stds[s], f32))
              << "scale " << scale << " std " << stds[s];
          for (std::int64_t j = 0; j < n; ++j) {
            const std::uint8_t code = codes[static_cast<std::size_t>(j)];
            ASSERT_EQ(read_value(out.data(), j, f32), want_value(code, scale, j, key, stds[s], f32))
                << (f32 ? "f32" : "bf16") << " code " << int{code} << " x " << scale << " at " << j
                << " of " << n << ", std " << stds[s] << ", key " << key;
          }
          ASSERT_TRUE(out.guards_intact()) << "written outside the row, n " << n;
        }
      }
    }
  }
}

// The rows the kernel leaves to the batch copy's other way: it says so, and writes nothing
// outside the row.
TEST_P(Fp8NoiseRowTest, RefusesRowsItsTablesDoNotCover) {
  const auto n = static_cast<std::int64_t>(3 * step() + 9);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<std::uint8_t>((7 * i) % 0x7F);
  }
  const float scale = round_to_dtype<DType::kBF16>(0.37f);
  for (const bool f32 : f32_cases()) {
    GuardedRow out((f32 ? 4 : 2) * codes.size(), true);
    // A NaN code anywhere: in a step or in the tail.
    for (std::int64_t at = 0; at < n; ++at) {
      std::vector<std::uint8_t> with_nan = codes;
      with_nan[static_cast<std::size_t>(at)] = at % 2 == 0 ? 0x7F : 0xFF;
      EXPECT_FALSE(row(with_nan.data(), scale, out.data(), n, 1u, 0.05f, f32)) << "NaN at " << at;
    }
    // Scales outside [2^-119, 2^118), and a NaN std.
    for (const float other :
         {0.0f, -0.0f, 0x1.fep-120f, 0x1p118f, 1e-40f, std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      EXPECT_FALSE(
          row(codes.data(), round_to_dtype<DType::kBF16>(other), out.data(), n, 1u, 0.05f, f32))
          << "scale " << other;
    }
    EXPECT_FALSE(
        row(codes.data(), scale, out.data(), n, 1u, std::numeric_limits<float>::quiet_NaN(), f32));
    EXPECT_TRUE(out.guards_intact());
  }
}

}  // namespace
}  // namespace draftfeed
