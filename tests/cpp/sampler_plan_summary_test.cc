// summarize_plan on hand-built plans whose figures are simple arithmetic.
#include <gtest/gtest.h>

#include <vector>

#include "draftfeed/sampler/plan_summary.h"

namespace draftfeed {
namespace {

RankPlan rank_of(std::vector<std::vector<std::int64_t>> batches) {
  RankPlan plan;
  for (const auto& batch : batches) {
    plan.samples.insert(plan.samples.end(), batch.begin(), batch.end());
    plan.batch_offsets.push_back(static_cast<std::int64_t>(plan.samples.size()));
  }
  return plan;
}

TEST(SamplerPlanSummary, FillAndSpreadAcrossRanks) {
  // max_len 10; sample 4 is long (15) and counts as 10 tokens.
  const std::vector<std::int64_t> lengths{5, 3, 2, 8, 15, 1};
  AllRanksPlan plan;
  plan.num_batches = 2;
  plan.ranks.push_back(rank_of({{0, 1}, {4}}));  // 8 and 10 tokens, 3 samples
  plan.ranks.push_back(rank_of({{3}, {2, 5}}));  // 8 and 3 tokens, 3 samples
  const PlanSummary s = summarize_plan(plan, lengths, 10);
  EXPECT_EQ(s.batches_per_rank, 2);
  EXPECT_EQ(s.planned_tokens, 29);
  EXPECT_DOUBLE_EQ(s.fill_mean_percent, (80.0 + 100.0 + 80.0 + 30.0) / 4);
  EXPECT_DOUBLE_EQ(s.fill_min_percent, 30.0);
  EXPECT_EQ(s.tokens_per_rank.max, 18);
  EXPECT_EQ(s.tokens_per_rank.min, 11);
  EXPECT_DOUBLE_EQ(s.tokens_per_rank.ratio, 18.0 / 11.0);
  EXPECT_EQ(s.samples_per_rank.max, 3);
  EXPECT_DOUBLE_EQ(s.samples_per_rank.ratio, 1.0);
}

TEST(SamplerPlanSummary, EmptyPlanHasZeroFiguresNotNaN) {
  AllRanksPlan plan;
  plan.ranks.resize(3);
  const PlanSummary s = summarize_plan(plan, {}, 10);
  EXPECT_EQ(s.fill_mean_percent, 0.0);
  EXPECT_EQ(s.fill_min_percent, 0.0);
  EXPECT_EQ(s.tokens_per_rank.ratio, 0.0);
}

}  // namespace
}  // namespace draftfeed
