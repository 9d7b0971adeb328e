#include "draftfeed/sampler/plan_summary.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace draftfeed {

namespace {

RankSpread spread_of(const std::vector<std::int64_t>& per_rank) {
  RankSpread spread;
  if (per_rank.empty()) return spread;
  const auto [min_it, max_it] = std::minmax_element(per_rank.begin(), per_rank.end());
  spread.max = *max_it;
  spread.min = *min_it;
  spread.ratio =
      spread.min > 0 ? static_cast<double>(spread.max) / static_cast<double>(spread.min) : 0.0;
  return spread;
}

}  // namespace

PlanSummary summarize_plan(const AllRanksPlan& plan, std::span<const std::int64_t> lengths,
                           std::int64_t max_len) {
  PlanSummary summary;
  summary.batches_per_rank = plan.num_batches;
  std::vector<std::int64_t> tokens(plan.ranks.size(), 0);
  std::vector<std::int64_t> samples(plan.ranks.size(), 0);
  double fill_sum = 0;
  double fill_min = std::numeric_limits<double>::infinity();
  std::int64_t num_fills = 0;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankPlan& rank = plan.ranks[r];
    for (std::int64_t b = 0; b < rank.num_batches(); ++b) {
      std::int64_t batch_tokens = 0;
      for (const std::int64_t sample : rank.batch(b)) {
        batch_tokens += std::min(lengths[static_cast<std::size_t>(sample)], max_len);
      }
      const double fill = 100.0 * static_cast<double>(batch_tokens) / static_cast<double>(max_len);
      fill_sum += fill;
      fill_min = std::min(fill_min, fill);
      ++num_fills;
      tokens[r] += batch_tokens;
    }
    samples[r] = static_cast<std::int64_t>(rank.samples.size());
    summary.planned_tokens += tokens[r];
  }
  if (num_fills > 0) {
    summary.fill_mean_percent = fill_sum / static_cast<double>(num_fills);
    summary.fill_min_percent = fill_min;
  }
  summary.tokens_per_rank = spread_of(tokens);
  summary.samples_per_rank = spread_of(samples);
  return summary;
}

}  // namespace draftfeed
