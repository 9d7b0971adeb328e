// The AVX2 kernels for rows without noise (batch/cast_row.h), called directly, against the scalar
// definitions bit for bit: copies of bf16, f16 and f32 rows and their non-finite counts, and casts
// of f16 (every one of the 65536 codes) and f32 (random bits, NaNs with payloads, infinities,
// subnormals, ties) to bf16; at widths around the 16-value blocks, to 32-byte aligned rows
// (streaming stores) and unaligned ones, nothing written outside the row. Then the batch copy,
// which picks them, over rows with strides.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "draftfeed/batch/cast_row.h"
#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/common/dtype.h"
#include "guarded_row.h"

namespace draftfeed {
namespace {

const std::int64_t kWidths[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 279, 1000};

// Random bits of `n` values of `dtype`, a quarter of them special (NaN with payloads, Inf,
// subnormal, zero, largest finite), the rest any bits or ordinary magnitudes.
std::vector<std::uint8_t> random_values(DType dtype, std::int64_t n, std::uint32_t seed) {
  static const std::uint32_t special32[] = {0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345,
                                            0x7FFFFFFF, 0x7F800000, 0xFF800000, 0x00000001,
                                            0x80000001, 0x007FFFFF, 0x00000000, 0x80000000,
                                            0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000};
  static const std::uint16_t special16[] = {0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF, 0x7C00,
                                            0xFC00, 0x0001, 0x8001, 0x03FF, 0x0000, 0x8000,
                                            0x7BFF, 0xFBFF, 0x7F80, 0x7FC0};
  std::mt19937 rng(seed);
  const std::size_t size = dtype_size(dtype);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * size);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t r = rng();
    std::uint32_t bits = rng();
    if (r % 4 == 0) {
      bits = size == 4 ? special32[(r >> 8) % 16] : special16[(r >> 8) % 16];
    } else if (r % 4 == 1) {
      const float v = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
      std::uint32_t f;
      std::memcpy(&f, &v, 4);
      bits = size == 4 ? f : dtype == DType::kF16 ? float_to_f16(v) : float_to_bf16(v);
    }
    std::memcpy(out.data() + static_cast<std::size_t>(i) * size, &bits, size);
  }
  return out;
}

bool nonfinite(const std::uint8_t* src, DType dtype, std::int64_t i) {
  if (dtype == DType::kF32) {
    std::uint32_t v;
    std::memcpy(&v, src + 4 * i, 4);
    return (v & 0x7F800000u) == 0x7F800000u;
  }
  std::uint16_t v;
  std::memcpy(&v, src + 2 * i, 2);
  const std::uint16_t mask = dtype == DType::kF16 ? 0x7C00 : 0x7F80;
  return (v & mask) == mask;
}

// The scalar definition of the cast: float_to_bf16 of the value as a float.
std::uint16_t cast_bf16(const std::uint8_t* src, DType dtype, std::int64_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, src + 4 * i, 4);
    return float_to_bf16(v);
  }
  std::uint16_t h;
  std::memcpy(&h, src + 2 * i, 2);
  return float_to_bf16(f16_to_float(h));
}

TEST(CastRowTest, CopiesEqualTheSourceAndCountItsNonFiniteValues) {
  if (!cast_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::size_t size = dtype_size(dtype);
    for (const std::int64_t n : kWidths) {
      for (const bool aligned : {true, false}) {
        const auto src = random_values(dtype, n, static_cast<std::uint32_t>(n * 7 + size));
        GuardedRow row(src.size(), aligned);
        const std::int64_t bad =
            copy_row_avx2(src.data(), dtype, row.data(), n, RowStores::kStreamed);
        std::int64_t want_bad = 0;
        for (std::int64_t i = 0; i < n; ++i) want_bad += nonfinite(src.data(), dtype, i);
        EXPECT_EQ(bad, want_bad) << "size " << size << " n " << n << " aligned " << aligned;
        ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(row.data(), src.data(), src.size()))
            << "size " << size << " n " << n << " aligned " << aligned;
        ASSERT_TRUE(row.guards_intact()) << "size " << size << " n " << n;
      }
    }
  }
}

// Long rows of nothing but non-finite values: the 16-bit lane counts are widened before they wrap.
TEST(CastRowTest, CountsLongRowsOfNonFiniteValuesExactly) {
  if (!cast_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  constexpr std::int64_t kN = (std::int64_t{1} << 21) + 37;
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    const std::size_t size = dtype_size(dtype);
    std::vector<std::uint8_t> src(static_cast<std::size_t>(kN) * size);
    const std::uint32_t nan32 = 0x7FC00001u;
    const std::uint16_t nan16 = 0xFF80u;  // -Inf
    for (std::int64_t i = 0; i < kN; ++i) {
      if (size == 4) {
        std::memcpy(src.data() + 4 * i, &nan32, 4);
      } else {
        std::memcpy(src.data() + 2 * i, &nan16, 2);
      }
    }
    for (const bool aligned : {true, false}) {
      GuardedRow row(src.size(), aligned);
      EXPECT_EQ(copy_row_avx2(src.data(), dtype, row.data(), kN, RowStores::kStreamed), kN)
          << "size " << size;
      EXPECT_EQ(0, std::memcmp(row.data(), src.data(), src.size()));
    }
  }
}

TEST(CastRowTest, EveryF16CodeCastsAsTheScalarDefinition) {
  if (!cast_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  constexpr std::int64_t kN = 65536 + 21;  // every code, then a tail
  std::vector<std::uint8_t> src(2 * kN);
  for (std::int64_t i = 0; i < kN; ++i) {
    const auto code = static_cast<std::uint16_t>(i * 40503u);  // odd multiplier: a permutation
    std::memcpy(src.data() + 2 * i, &code, 2);
  }
  for (const bool aligned : {true, false}) {
    GuardedRow row(2 * kN, aligned);
    const std::int64_t bad =
        cast_bf16_row_avx2(src.data(), DType::kF16, row.data(), kN, RowStores::kStreamed);
    std::int64_t want_bad = 0;
    for (std::int64_t i = 0; i < kN; ++i) {
      want_bad += nonfinite(src.data(), DType::kF16, i);
      std::uint16_t got;
      std::memcpy(&got, row.data() + 2 * i, 2);
      ASSERT_EQ(got, cast_bf16(src.data(), DType::kF16, i))
          << "f16 0x" << std::hex << static_cast<int>(src[2 * i] | (src[2 * i + 1] << 8));
    }
    EXPECT_EQ(bad, want_bad);
    EXPECT_TRUE(row.guards_intact());
  }
}

// Rows without NaN take the vector round for every block (a block holding a NaN takes the scalar
// definition): every other code, in order, so that every one goes through the vector path; and a
// long row of infinities with a NaN now and then, counted across the widening of the 16-bit lanes.
TEST(CastRowTest, EveryNonNanF16CodeTakesTheVectorRoundAndLongRowsCountExactly) {
  if (!cast_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  std::vector<std::uint8_t> src;
  for (std::uint32_t code = 0; code < 65536; ++code) {
    if ((code & 0x7C00u) == 0x7C00u && (code & 0x03FFu) != 0) continue;  // NaN
    src.push_back(static_cast<std::uint8_t>(code));
    src.push_back(static_cast<std::uint8_t>(code >> 8));
  }
  constexpr std::int64_t kLong = (std::int64_t{1} << 21) + 37;
  std::vector<std::uint8_t> infinities(2 * kLong);
  for (std::int64_t i = 0; i < kLong; ++i) {
    const std::uint16_t code = i % 100003 == 5 ? 0x7E01 : (i % 2 != 0 ? 0x7C00 : 0xFC00);
    std::memcpy(infinities.data() + 2 * i, &code, 2);
  }
  for (const auto* row_src : {&src, &infinities}) {
    const auto n = static_cast<std::int64_t>(row_src->size() / 2);
    for (const bool aligned : {true, false}) {
      GuardedRow row(row_src->size(), aligned);
      const std::int64_t bad =
          cast_bf16_row_avx2(row_src->data(), DType::kF16, row.data(), n, RowStores::kStreamed);
      std::int64_t want_bad = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        want_bad += nonfinite(row_src->data(), DType::kF16, i);
        std::uint16_t got;
        std::memcpy(&got, row.data() + 2 * i, 2);
        ASSERT_EQ(got, cast_bf16(row_src->data(), DType::kF16, i)) << "value " << i;
      }
      EXPECT_EQ(bad, want_bad) << "n " << n;
      EXPECT_TRUE(row.guards_intact());
    }
  }
}

TEST(CastRowTest, CastsEqualTheScalarDefinitionBitForBit) {
  if (!cast_row_avx2_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  for (const DType dtype : {DType::kF16, DType::kF32}) {
    for (const std::int64_t n : kWidths) {
      for (const bool aligned : {true, false}) {
        const auto src = random_values(dtype, n, static_cast<std::uint32_t>(n * 13 + 1));
        GuardedRow row(static_cast<std::size_t>(n) * 2, aligned);
        const std::int64_t bad =
            cast_bf16_row_avx2(src.data(), dtype, row.data(), n, RowStores::kStreamed);
        std::int64_t want_bad = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          want_bad += nonfinite(src.data(), dtype, i);
          std::uint16_t got;
          std::memcpy(&got, row.data() + 2 * i, 2);
          ASSERT_EQ(got, cast_bf16(src.data(), dtype, i)) << "n " << n << " position " << i;
        }
        EXPECT_EQ(bad, want_bad) << "n " << n;
        ASSERT_TRUE(row.guards_intact()) << "n " << n;
      }
    }
  }
}

// The batch copy takes these kernels for every source it can (bf16, f16, f32 into bf16; a dtype
// into itself): rows with strides, the padding between rows untouched, the same bits and count
// as the definitions (on a CPU without AVX2 the scalar code runs, and must give them too).
TEST(CastRowTest, BatchCopyWithoutNoiseGivesTheDefinitions) {
  constexpr std::int64_t kRows = 5, kWidth = 279, kSrcStride = 300, kDstStride = 290;
  struct Case {
    DType src, dst;
    RowStores stores;
  };
  for (const Case p : {Case{DType::kBF16, DType::kBF16, RowStores::kStreamed},
                       Case{DType::kBF16, DType::kBF16, RowStores::kCached},
                       Case{DType::kF32, DType::kF32, RowStores::kStreamed},
                       Case{DType::kF16, DType::kBF16, RowStores::kStreamed},
                       Case{DType::kF32, DType::kBF16, RowStores::kCached}}) {
    const auto src = random_values(p.src, kRows * kSrcStride, 31);
    const std::size_t out_size = dtype_size(p.dst);
    GuardedRow out(out_size * kRows * kDstStride, /*aligned=*/true);
    std::memset(out.data(), 0xCD, out_size * kRows * kDstStride);
    RowCopy job;
    job.src = src.data();
    job.src_dtype = p.src;
    job.src_row_stride = kSrcStride;
    job.dst = out.data();
    job.dst_dtype = p.dst;
    job.dst_row_stride = kDstStride;
    job.rows = kRows;
    job.width = kWidth;
    job.stores = p.stores;
    const std::int64_t bad = copy_hidden_rows(job);
    std::int64_t want_bad = 0;
    const std::size_t in_size = dtype_size(p.src);
    for (std::int64_t r = 0; r < kRows; ++r) {
      const std::uint8_t* in = src.data() + static_cast<std::size_t>(r * kSrcStride) * in_size;
      const std::uint8_t* got = out.data() + static_cast<std::size_t>(r * kDstStride) * out_size;
      for (std::int64_t i = 0; i < kWidth; ++i) {
        want_bad += nonfinite(in, p.src, i);
        if (p.src == p.dst) {
          ASSERT_EQ(0, std::memcmp(got + i * out_size, in + i * in_size, in_size));
        } else {
          std::uint16_t bits;
          std::memcpy(&bits, got + 2 * i, 2);
          ASSERT_EQ(bits, cast_bf16(in, p.src, i)) << "row " << r << " position " << i;
        }
      }
      for (std::int64_t i = kWidth * static_cast<std::int64_t>(out_size);
           i < kDstStride * static_cast<std::int64_t>(out_size); ++i) {
        ASSERT_EQ(got[i], 0xCD) << "padding written, row " << r;
      }
    }
    EXPECT_EQ(bad, want_bad);
    EXPECT_TRUE(out.guards_intact());
  }
}

}  // namespace
}  // namespace draftfeed
