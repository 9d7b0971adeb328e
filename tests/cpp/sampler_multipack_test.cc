// The planner's invariants in C++ (the comparison with speculators' sampler itself is in
// tests/python/test_sampler_plan.py): capacity, disjoint coverage, equal batch counts, agreement of
// plan_rank with plan_all_ranks, the counts, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/sampler/multipack.h"
#include "draftfeed/sampler/numpy_random.h"

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

// docs/sampler.md written the plain way (a std::priority_queue of (fill, slot), a stable sort),
// with the planner's documented tie rule. The planner's fast LPT must give exactly this, ties
// included, which the Python oracle cannot check (the reference orders ties by an unstable sort).
std::vector<std::vector<std::vector<std::int64_t>>> textbook_plan(
    const std::vector<std::int64_t>& shuffled_lengths, const std::vector<std::int64_t>& shuffled,
    std::int64_t max_len, int world) {
  using Bin = std::pair<std::int64_t, int>;  // (fill, slot)
  const auto lpt = [&](std::size_t begin, std::size_t count, std::vector<int>* slots) {
    std::vector<std::size_t> order(count);
    for (std::size_t p = 0; p < count; ++p) order[p] = count - 1 - p;  // later position first
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return shuffled_lengths[begin + a] > shuffled_lengths[begin + b];
    });
    std::priority_queue<Bin, std::vector<Bin>, std::greater<>> bins;
    for (int s = 0; s < world; ++s) bins.push({0, s});
    if (slots) slots->clear();
    for (const std::size_t p : order) {
      Bin bin = bins.top();
      bins.pop();
      bin.first += shuffled_lengths[begin + p];
      if (bin.first > max_len) return false;
      if (slots) slots->push_back(bin.second);
      bins.push(bin);
    }
    return true;
  };
  std::vector<std::vector<std::vector<std::int64_t>>> ranks(static_cast<std::size_t>(world));
  std::vector<std::int64_t> cumsum(shuffled_lengths.size());
  std::partial_sum(shuffled_lengths.begin(), shuffled_lengths.end(), cumsum.begin());
  std::size_t ind = 0;
  for (std::int64_t batch_no = 0; shuffled.size() - ind >= static_cast<std::size_t>(world);
       ++batch_no) {
    const std::int64_t before = ind == 0 ? 0 : cumsum[ind - 1];
    const auto fit = static_cast<std::int64_t>(
        std::upper_bound(cumsum.begin() + static_cast<std::ptrdiff_t>(ind), cumsum.end(),
                         before + max_len * world) -
        (cumsum.begin() + static_cast<std::ptrdiff_t>(ind)));
    std::int64_t left = 1;
    std::int64_t right = 1 + fit;
    while (right - left > 1 && right > world) {
      const std::int64_t mid = (left + right) / 2;
      (lpt(ind, static_cast<std::size_t>(mid), nullptr) ? left : right) = mid;
    }
    std::vector<int> slots;
    lpt(ind, static_cast<std::size_t>(left), &slots);
    std::vector<std::size_t> order(static_cast<std::size_t>(left));
    for (std::size_t p = 0; p < order.size(); ++p) order[p] = order.size() - 1 - p;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return shuffled_lengths[ind + a] > shuffled_lengths[ind + b];
    });
    for (auto& rank : ranks) rank.emplace_back();
    for (std::size_t t = 0; t < order.size(); ++t) {
      const auto rank = static_cast<std::size_t>((slots[t] + batch_no) % world);
      ranks[rank].back().push_back(shuffled[ind + order[t]]);
    }
    ind += static_cast<std::size_t>(left);
  }
  return ranks;
}

TEST(SamplerMultipack, FastPackingEqualsTheTextbookAlgorithmWithTiesAndZeros) {
  std::mt19937_64 gen(5);
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<std::int64_t> lengths(3000);
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      lengths[i] = static_cast<std::int64_t>(gen() % 12) * 100;  // ties, zeros
      if (variant >= 2 && i % 5 == 0) lengths[i] = 0;
    }
    for (const int world : {1, 2, 7, 16}) {
      const PlanOptions options{.max_len = 1000, .world_size = world, .seed = 4};
      const std::int64_t epoch = variant;
      // The planner's shuffle, recomputed: numpy's permutation of all indices (truncate mode).
      const auto shuffled = numpy_permutation(options.seed + static_cast<std::uint64_t>(epoch),
                                              static_cast<std::int64_t>(lengths.size()));
      std::vector<std::int64_t> shuffled_lengths;
      for (const auto i : shuffled) {
        shuffled_lengths.push_back(std::min(lengths[static_cast<std::size_t>(i)], options.max_len));
      }
      const auto want = textbook_plan(shuffled_lengths, shuffled, options.max_len, world);
      const AllRanksPlan got = plan_all_ranks(lengths, options, epoch);
      for (std::size_t r = 0; r < want.size(); ++r) {
        ASSERT_EQ(got.ranks[r].num_batches(), static_cast<std::int64_t>(want[r].size()));
        for (std::size_t b = 0; b < want[r].size(); ++b) {
          const auto batch = got.ranks[r].batch(static_cast<std::int64_t>(b));
          EXPECT_EQ(std::vector<std::int64_t>(batch.begin(), batch.end()), want[r][b])
              << "variant " << variant << " world " << world << " rank " << r << " batch " << b;
        }
      }
    }
  }
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

// The window order decides only which of several equal-length samples a rank gets: reversing the
// order of ties changes the indices, never the batch count or any batch's lengths, and the order
// is asked once per batch whose final window has ties.
TEST(SamplerMultipack, WindowOrderChoosesAmongTiesOnly) {
  std::vector<std::int64_t> lengths(3000);
  std::mt19937_64 gen(5);
  for (auto& length : lengths) length = 64 * static_cast<std::int64_t>(1 + gen() % 20);
  const PlanOptions native{.max_len = 4096, .world_size = 3, .seed = 1};
  PlanOptions reversed_ties = native;
  int calls = 0;
  // Ascending by length, ties by descending position: the opposite of the native order.
  reversed_ties.window_order = [&](std::span<const std::int64_t> window,
                                   std::span<std::int64_t> order) {
    ++calls;
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const auto la = window[static_cast<std::size_t>(a)];
      const auto lb = window[static_cast<std::size_t>(b)];
      return la != lb ? la < lb : a > b;
    });
  };
  const AllRanksPlan a = plan_all_ranks(lengths, native, 0);
  const AllRanksPlan b = plan_all_ranks(lengths, reversed_ties, 0);
  ASSERT_EQ(a.num_batches, b.num_batches);
  EXPECT_GT(calls, 0);
  EXPECT_LE(calls, b.num_batches);
  bool some_differ = false;
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    for (std::int64_t batch = 0; batch < a.num_batches; ++batch) {
      const auto x = a.ranks[r].batch(batch);
      const auto y = b.ranks[r].batch(batch);
      std::vector<std::int64_t> lx, ly;
      for (const auto s : x) lx.push_back(lengths[static_cast<std::size_t>(s)]);
      for (const auto s : y) ly.push_back(lengths[static_cast<std::size_t>(s)]);
      EXPECT_EQ(lx, ly) << "rank " << r << " batch " << batch;  // same lengths, same order
      some_differ = some_differ || !std::equal(x.begin(), x.end(), y.begin(), y.end());
    }
  }
  EXPECT_TRUE(some_differ);

  PlanOptions broken = native;
  broken.window_order = [](std::span<const std::int64_t>, std::span<std::int64_t> order) {
    std::fill(order.begin(), order.end(), 0);  // not a permutation
  };
  EXPECT_THROW(plan_all_ranks(lengths, broken, 0), Error);
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
