// numpy's permutation: numpy's own outputs for small seeds (docs/sampler.md), plus properties that
// hold for any seed. The thorough bit-for-bit comparison with numpy itself is
// tests/python/test_sampler_permutation.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/sampler/numpy_random.h"

namespace draftfeed {
namespace {

TEST(SamplerNumpyRandom, SpecVectors) {
  // numpy's default_rng(seed).permutation(10) for seeds 0, 1, 42.
  EXPECT_EQ(numpy_permutation(0, 10), (std::vector<std::int64_t>{4, 6, 2, 7, 3, 5, 9, 0, 8, 1}));
  EXPECT_EQ(numpy_permutation(1, 10), (std::vector<std::int64_t>{8, 4, 7, 0, 1, 2, 5, 9, 6, 3}));
  EXPECT_EQ(numpy_permutation(42, 10), (std::vector<std::int64_t>{5, 6, 0, 7, 3, 2, 4, 9, 1, 8}));
}

TEST(SamplerNumpyRandom, SeedWordsSplitLeastSignificantFirst) {
  EXPECT_EQ(seed_words(0), (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(seed_words(42), (std::vector<std::uint32_t>{42}));
  EXPECT_EQ(seed_words((Uint128{1} << 40) + 7), (std::vector<std::uint32_t>{7, 256}));
  EXPECT_EQ(seed_words(Uint128{1} << 64), (std::vector<std::uint32_t>{0, 0, 1}));
}

TEST(SamplerNumpyRandom, PermutationIsAPermutation) {
  for (const std::int64_t n : {0, 1, 2, 3, 17, 1000}) {
    auto perm = numpy_permutation(7, n);
    ASSERT_EQ(static_cast<std::int64_t>(perm.size()), n);
    std::sort(perm.begin(), perm.end());
    std::vector<std::int64_t> expected(static_cast<std::size_t>(n));
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(perm, expected) << "n=" << n;
  }
}

TEST(SamplerNumpyRandom, PermutationOfArrayMovesItemsLikeTheIndexPermutation) {
  // Shuffling an array applies the same swaps as shuffling arange(n): item k lands where index k
  // does.
  const std::vector<std::int64_t> items{100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110};
  const auto words = seed_words(5);
  const auto shuffled = numpy_permutation_of(words, items);
  const auto perm = numpy_permutation(words, static_cast<std::int64_t>(items.size()));
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(shuffled[i], items[static_cast<std::size_t>(perm[i])]);
  }
}

TEST(SamplerNumpyRandom, Next32UsesBothHalvesOfOneNext64) {
  const auto state = seed_sequence_state(seed_words(3));
  Pcg64 wide(state);
  Pcg64 narrow(state);
  const std::uint64_t word = wide.next64();
  EXPECT_EQ(narrow.next32(), static_cast<std::uint32_t>(word));
  EXPECT_EQ(narrow.next32(), static_cast<std::uint32_t>(word >> 32));
  EXPECT_EQ(narrow.next64(), wide.next64());
}

// interval(max) against its definition, drawn from a twin generator: the first raw draw (a 32-bit
// half while max fits in 32 bits, a whole 64-bit output beyond) masked to the smallest all-ones
// value >= max that is <= max. So max = 0 draws nothing, and max = 2^64 - 1 takes one 64-bit
// output as it is; a wrong mask, width or rejection shows as a different value or a twin out of
// step.
TEST(SamplerNumpyRandom, IntervalIsTheFirstMaskedDrawInRange) {
  Pcg64 rng(seed_sequence_state(seed_words(11)));
  Pcg64 twin(seed_sequence_state(seed_words(11)));
  for (const std::uint64_t max : {0ULL, 1ULL, 2ULL, 5ULL, 0xFFFFFFFFULL, 0x100000000ULL,
                                  0x8000000000000001ULL, 0xFFFFFFFFFFFFFFFFULL}) {
    std::uint64_t mask = 0;
    while (mask < max) mask = (mask << 1) | 1;
    for (int i = 0; i < 200; ++i) {
      std::uint64_t expected = 0;
      if (max != 0) {
        do {
          expected = (max <= 0xFFFFFFFFULL ? twin.next32() : twin.next64()) & mask;
        } while (expected > max);
      }
      ASSERT_EQ(rng.interval(max), expected) << "max " << max << ", draw " << i;
    }
  }
  EXPECT_EQ(rng.next64(), twin.next64()) << "the same number of raw draws";
}

TEST(SamplerNumpyRandom, IntervalReachesEveryValueOfASmallRange) {
  Pcg64 rng(seed_sequence_state(seed_words(3)));
  std::vector<int> seen(6, 0);
  for (int i = 0; i < 600; ++i) ++seen.at(static_cast<std::size_t>(rng.interval(5)));
  for (std::size_t v = 0; v < seen.size(); ++v) EXPECT_GT(seen[v], 50) << "value " << v;
}

TEST(SamplerNumpyRandom, NegativeSizeIsRefused) {
  try {
    (void)numpy_permutation(0, -3);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("-3"), std::string::npos);
  }
}

}  // namespace
}  // namespace draftfeed
