// The AVX2 kernels for bf16 rows plus uniform noise into a bf16 or f32 batch and the AVX-512 one
// into a bf16 batch (batch/noise_bf16_row.h), each called directly (the AVX-512 one skipped on a
// CPU without it), against the scalar definition (hidden_copy.cc's
// row_uniform, written out here from noise.h) bit for bit: random bf16 values mixed with NaNs
// (quiet and signalling, both signs), infinities, subnormals, zeros of both signs and the largest
// finite values, at widths around the 16-value blocks and the odd last value, several keys, and
// noise scales from none to large enough to overflow to Inf, and Inf; the count of non-finite
// source values; nothing written outside the row, at unaligned addresses. Then the batch copy,
// which picks the kernel, over several rows with strides.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "avx512_allowed.h"
#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/noise_bf16_row.h"
#include "draftfeed/common/dtype.h"
#include "guarded_row.h"
#include "vector_kernel_param.h"

namespace draftfeed {
namespace {

constexpr std::uint8_t kGuard = 0xAB;

std::vector<std::uint16_t> random_bf16(std::int64_t n, std::uint32_t seed) {
  static const std::uint16_t special[] = {0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0x7F80,
                                          0xFF80, 0x0001, 0x8001, 0x007F, 0x0000, 0x8000,
                                          0x7F7F, 0xFF7F, 0x0080, 0x3F80};
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> values(static_cast<std::size_t>(n));
  for (auto& v : values) {
    const std::uint32_t r = rng();
    if (r % 4 == 0) {
      v = special[(r >> 8) % (sizeof special / sizeof special[0])];
    } else if (r % 4 == 1) {
      v = static_cast<std::uint16_t>(r >> 16);  // any bits
    } else {
      // Ordinary magnitudes, where the noise shows in the rounding.
      v = float_to_bf16(std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng));
    }
  }
  return values;
}

// row_uniform (hidden_copy.cc) for a bf16 source: value i as float32, or as bf16 bits widened.
std::uint32_t scalar_value(const std::vector<std::uint16_t>& in, std::int64_t i, std::uint32_t key,
                           float std_dev, bool f32) {
  const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(i / 2));
  const float draw = i % 2 == 0 ? noise_signed_low(bits) : noise_signed_high(bits);
  const float value = bf16_to_float(in[static_cast<std::size_t>(i)]) + draw * std_dev;
  if (!f32) return float_to_bf16(value);
  std::uint32_t out;
  std::memcpy(&out, &value, 4);
  return out;
}

class NoiseBf16RowTest : public VectorKernelTest {
 protected:
  void SetUp() override {
    skip_unless_available(noise_bf16_row_avx2_available(), noise_bf16_row_avx512_available());
  }

  std::int64_t row(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n, std::uint32_t key,
                   float std_dev, bool f32, RowStores stores) const {
    if (GetParam() == VectorIsa::kAvx512) {
      return noise_bf16_row_avx512(src, dst, n, key, std_dev, stores);
    }
    return f32 ? noise_bf16_f32_row_avx2(src, dst, n, key, std_dev, stores)
               : noise_bf16_row_avx2(src, dst, n, key, std_dev, stores);
  }
};

INSTANTIATE_TEST_SUITE_P(Kernels, NoiseBf16RowTest,
                         testing::Values(VectorIsa::kAvx2, VectorIsa::kAvx512), vector_isa_name);

std::uint32_t read_value(const std::uint8_t* base, std::int64_t i, bool f32) {
  if (f32) {
    std::uint32_t v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
  std::uint16_t v;
  std::memcpy(&v, base + 2 * i, 2);
  return v;
}

TEST_P(NoiseBf16RowTest, EqualsTheScalarDefinitionBitForBit) {
  // Around 2^-95 the kernel switches between its two forms of the noise term (noise_bf16_row.cc).
  const std::vector<float> stds = {0.0f,
                                   0.05f,
                                   1.0f,
                                   1e38f,
                                   3.4e38f,
                                   1e-30f,
                                   0x1.fffffep-96f,
                                   0x1p-95f,
                                   3e-39f,
                                   0x1p-149f,
                                   std::numeric_limits<float>::infinity()};
  const std::vector<std::uint32_t> keys = {0u, 1u, 0x9E3779B9u, 0xFFFFFFFFu,
                                           noise_token_key(noise_sample_key(7, 2, 11), 5)};
  for (const bool f32 : f32_cases()) {
    const std::size_t size = f32 ? 4 : 2;
    for (const std::int64_t n : {0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 279, 1000}) {
      for (std::size_t s = 0; s < stds.size(); ++s) {
        for (std::size_t k = 0; k < keys.size(); ++k) {
          const auto in = random_bf16(n, static_cast<std::uint32_t>(1000 * n + 10 * s + k));
          std::int64_t want_bad = 0;
          for (const std::uint16_t v : in) want_bad += (v & 0x7F80) == 0x7F80;
          // Unaligned source; the destination aligned (streaming stores) for even keys,
          // unaligned (ordinary stores) for odd ones.
          std::vector<std::uint8_t> src(2 * in.size() + 1);
          if (!in.empty()) std::memcpy(src.data() + 1, in.data(), 2 * in.size());
          GuardedRow out(size * in.size(), k % 2 == 0);
          std::uint8_t* dst = out.data();
          const std::int64_t bad =
              row(src.data() + 1, dst, n, keys[k], stds[s], f32, RowStores::kStreamed);
          for (std::int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(read_value(dst, i, f32), scalar_value(in, i, keys[k], stds[s], f32))
                << (f32 ? "f32" : "bf16") << " n " << n << " position " << i << " input 0x"
                << std::hex << in[static_cast<std::size_t>(i)] << std::dec << " std " << stds[s]
                << " key " << keys[k];
          }
          EXPECT_EQ(bad, want_bad) << "n " << n << " std " << stds[s];
          ASSERT_TRUE(out.guards_intact()) << "written outside the row, n " << n;
        }
      }
    }
  }
}

// A long row: sums exactly halfway between two bf16 values (about one in 2^16 here) round to
// even, and the non-finite source values of two million are counted exactly.
TEST_P(NoiseBf16RowTest, LongRowRoundsTiesToEven) {
  constexpr std::int64_t kN = (std::int64_t{1} << 21) + 37;
  const auto in = random_bf16(kN, 5);
  const std::uint32_t key = 0x12345678u;
  std::vector<std::uint8_t> out(2 * kN);
  const std::int64_t bad = row(reinterpret_cast<const std::uint8_t*>(in.data()), out.data(), kN,
                               key, 0.05f, /*f32=*/false, RowStores::kCached);
  std::int64_t want_bad = 0, ties = 0;
  for (std::int64_t i = 0; i < kN; ++i) {
    want_bad += (in[static_cast<std::size_t>(i)] & 0x7F80) == 0x7F80;
    const std::uint32_t want = scalar_value(in, i, key, 0.05f, /*f32=*/false);
    ties += (scalar_value(in, i, key, 0.05f, /*f32=*/true) & 0xFFFFu) == 0x8000u;
    ASSERT_EQ(read_value(out.data(), i, false), want) << "position " << i;
  }
  EXPECT_EQ(bad, want_bad);
  EXPECT_GT(ties, 0);  // the round half to even was exercised
}

// A NaN scale (which the batch spec refuses) makes NaN noise terms carrying the scale's payload:
// bf16 results are quieted and truncated as float_to_bf16 does, not rounded into the next payload.
TEST_P(NoiseBf16RowTest, NaNScaleGivesTheScalarBits) {
  constexpr std::int64_t kN = 1000;
  std::vector<std::uint16_t> in(kN);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = float_to_bf16(0.01f * static_cast<float>(i));
  const std::uint32_t nan_bits = 0x7FC0FFFFu;
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  for (const bool f32 : f32_cases()) {
    std::vector<std::uint8_t> out((f32 ? 4 : 2) * kN);
    const auto* src = reinterpret_cast<const std::uint8_t*>(in.data());
    EXPECT_EQ(row(src, out.data(), kN, 7, nan, f32, RowStores::kCached), 0);
    for (std::int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(read_value(out.data(), i, f32), scalar_value(in, i, 7, nan, f32))
          << "position " << i;
    }
  }
}

// The batch copy takes the kernels for bf16 sources with uniform noise: rows with strides, each
// with its token's key, the same bits as the scalar definition, with AVX-512 allowed and not.
TEST(NoiseBf16BatchCopyTest, UsesTheTokenKeys) {
  constexpr std::int64_t kRows = 5, kWidth = 279, kSrcStride = 300, kDstStride = 290;
  const auto in = random_bf16(kRows * kSrcStride, 99);
  // With the AVX-512 kernel where the CPU has it, and without (the AVX2 one).
  for (const int f32_avx512 : {0, 1, 2, 3}) {
    const bool f32 = f32_avx512 % 2 == 1;
    const Avx512Allowed avx512(f32_avx512 >= 2);
    const std::size_t size = f32 ? 4 : 2;
    std::vector<std::uint8_t> out(size * kRows * kDstStride, kGuard);
    RowCopy job;
    job.src = reinterpret_cast<const std::uint8_t*>(in.data());
    job.src_dtype = DType::kBF16;
    job.src_row_stride = kSrcStride;
    job.dst = out.data();
    job.dst_dtype = f32 ? DType::kF32 : DType::kBF16;
    job.dst_row_stride = kDstStride;
    job.rows = kRows;
    job.width = kWidth;
    job.noise = NoiseKind::kUniform;
    job.noise_std = 0.25f;
    job.noise_sample_key = noise_sample_key(3, 1, 42);
    job.first_token = 17;
    const std::int64_t bad = copy_hidden_rows(job);
    std::int64_t want_bad = 0;
    for (std::int64_t r = 0; r < kRows; ++r) {
      const std::vector<std::uint16_t> row(in.begin() + r * kSrcStride,
                                           in.begin() + r * kSrcStride + kWidth);
      for (const std::uint16_t v : row) want_bad += (v & 0x7F80) == 0x7F80;
      const std::uint32_t key = noise_token_key(job.noise_sample_key, 17 + r);
      for (std::int64_t i = 0; i < kWidth; ++i) {
        ASSERT_EQ(read_value(out.data() + size * r * kDstStride, i, f32),
                  scalar_value(row, i, key, job.noise_std, f32))
            << "row " << r << " position " << i;
      }
      for (std::int64_t i = kWidth; i < kDstStride; ++i) {
        ASSERT_EQ(read_value(out.data() + size * r * kDstStride, i, f32),
                  f32 ? 0xABABABABu : 0xABABu);
      }
    }
    EXPECT_EQ(bad, want_bad);
  }
}

}  // namespace
}  // namespace draftfeed
