// The planner's invariants in C++ (the comparison with speculators' sampler itself is in
// tests/python/test_sampler_plan.py): capacity, disjoint coverage, equal batch counts, agreement of
// plan_rank with plan_all_ranks, the counts, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/sampler/multipack.h"

namespace draftfeed {
namespace {

std::vector<std::int64_t> lognormal_lengths(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::lognormal_distribution<double> dist(6.5, 1.0);
  std::vector<std::int64_t> lengths(n);
  for (auto& length : lengths) length = 1 + static_cast<std::int64_t>(dist(gen));
  return lengths;
}

std::int64_t tokens_of(std::span<const std::int64_t> batch, std::span<const std::int64_t> lengths,
                       std::int64_t max_len) {
  std::int64_t total = 0;
  for (const auto sample : batch)
    total += std::min(lengths[static_cast<std::size_t>(sample)], max_len);
  return total;
}

TEST(SamplerMultipack, BatchesFitAreDisjointAndCoverAllButTheTail) {
  const auto lengths = lognormal_lengths(5000, 1);
  for (const int world : {1, 3, 8}) {
    for (const bool truncate : {true, false}) {
      PlanOptions options{.max_len = 2048, .world_size = world, .seed = 9, .truncate = truncate};
      const AllRanksPlan plan = plan_all_ranks(lengths, options, 1);
      ASSERT_EQ(static_cast<int>(plan.ranks.size()), world);
      std::set<std::int64_t> seen;
      for (const auto& rank : plan.ranks) {
        ASSERT_EQ(rank.num_batches(), plan.num_batches);
        for (std::int64_t b = 0; b < rank.num_batches(); ++b) {
          EXPECT_LE(tokens_of(rank.batch(b), lengths, options.max_len), options.max_len);
          for (const auto sample : rank.batch(b)) {
            EXPECT_TRUE(seen.insert(sample).second) << "sample " << sample << " planned twice";
            if (!truncate) {
              EXPECT_LE(lengths[static_cast<std::size_t>(sample)], options.max_len);
            }
          }
        }
      }
      const PlanCounts& c = plan.counts;
      EXPECT_EQ(c.num_samples, 5000);
      EXPECT_EQ(c.planned, static_cast<std::int64_t>(seen.size()));
      EXPECT_EQ(c.planned + c.dropped_long + c.dropped_tail + c.cut_by_max_batches, c.num_samples);
      EXPECT_LT(c.dropped_tail, world);
      EXPECT_EQ(c.dropped_long, truncate ? 0 : c.num_long);
      EXPECT_GT(c.num_long, 0) << "the test wants some long samples";
    }
  }
}

TEST(SamplerMultipack, PlanRankEqualsItsShareOfPlanAllRanks) {
  const auto lengths = lognormal_lengths(3000, 2);
  PlanOptions options{.max_len = 4096, .world_size = 5, .seed = 3};
  const AllRanksPlan all = plan_all_ranks(lengths, options, 2);
  for (int rank = 0; rank < options.world_size; ++rank) {
    PlanCounts counts;
    const RankPlan one = plan_rank(lengths, options, rank, 2, &counts);
    EXPECT_EQ(one.samples, all.ranks[static_cast<std::size_t>(rank)].samples);
    EXPECT_EQ(one.batch_offsets, all.ranks[static_cast<std::size_t>(rank)].batch_offsets);
    EXPECT_EQ(counts.planned, all.counts.planned);
  }
}

TEST(SamplerMultipack, EpochsDifferAndRepeat) {
  const auto lengths = lognormal_lengths(1000, 3);
  PlanOptions options{.max_len = 4096, .world_size = 2};
  const auto a = plan_rank(lengths, options, 0, 0);
  const auto b = plan_rank(lengths, options, 0, 1);
  EXPECT_EQ(a.samples, plan_rank(lengths, options, 0, 0).samples);
  EXPECT_NE(a.samples, b.samples);
  // seed + epoch is what seeds the shuffle.
  PlanOptions seeded = options;
  seeded.seed = 1;
  EXPECT_EQ(plan_rank(lengths, seeded, 0, 0).samples, b.samples);
}

TEST(SamplerMultipack, MaxBatchesKeepsAPrefix) {
  const auto lengths = lognormal_lengths(2000, 4);
  PlanOptions options{.max_len = 4096, .world_size = 4};
  const AllRanksPlan full = plan_all_ranks(lengths, options, 0);
  ASSERT_GT(full.num_batches, 3);
  options.max_batches = 3;
  const AllRanksPlan cut = plan_all_ranks(lengths, options, 0);
  EXPECT_EQ(cut.num_batches, 3);
  for (std::size_t r = 0; r < cut.ranks.size(); ++r) {
    for (std::int64_t b = 0; b < 3; ++b) {
      const auto x = cut.ranks[r].batch(b);
      const auto y = full.ranks[r].batch(b);
      EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    }
  }
  EXPECT_GT(cut.counts.cut_by_max_batches, 0);
  EXPECT_EQ(cut.counts.dropped_tail, 0);
  options.max_batches = 0;
  EXPECT_EQ(plan_all_ranks(lengths, options, 0).num_batches, 0);
}

TEST(SamplerMultipack, FewerSamplesThanRanksPlanNothing) {
  const std::vector<std::int64_t> lengths{5, 6, 7};
  const AllRanksPlan plan = plan_all_ranks(lengths, PlanOptions{.max_len = 10, .world_size = 4}, 0);
  EXPECT_EQ(plan.num_batches, 0);
  EXPECT_EQ(plan.counts.dropped_tail, 3);
  EXPECT_EQ(plan_all_ranks({}, PlanOptions{.max_len = 10, .world_size = 1}, 0).num_batches, 0);
}

TEST(SamplerMultipack, ZeroLengthsAndTiesPackIntoOneBatch) {
  const std::vector<std::int64_t> lengths(100, 0);
  const AllRanksPlan plan = plan_all_ranks(lengths, PlanOptions{.max_len = 10, .world_size = 2}, 0);
  EXPECT_EQ(plan.num_batches, 1);
  EXPECT_EQ(plan.counts.planned, 100);
}

void expect_invalid(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    FAIL() << "expected an error mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(SamplerMultipack, BadArgumentsNameTheirValues) {
  const std::vector<std::int64_t> lengths{1, 2, -4};
  const std::vector<std::int64_t> good{1, 2};
  expect_invalid([&] { plan_all_ranks(lengths, PlanOptions{.max_len = 8}, 0); }, "sample 2");
  expect_invalid([&] { plan_all_ranks(good, PlanOptions{.max_len = 0}, 0); }, "got 0");
  expect_invalid([&] { plan_all_ranks(good, PlanOptions{.max_len = 8, .world_size = 0}, 0); },
                 "world_size");
  expect_invalid([&] { plan_all_ranks(good, PlanOptions{.max_len = 8}, -1); }, "epoch");
  expect_invalid([&] { plan_rank(good, PlanOptions{.max_len = 8, .world_size = 2}, 2, 0); },
                 "rank 2");
  expect_invalid([&] { plan_all_ranks(good, PlanOptions{.max_len = 8, .max_batches = -1}, 0); },
                 "max_batches");
}

}  // namespace
}  // namespace draftfeed
