// Figures that describe an epoch's plan: how full the batches are and how evenly the ranks are
// loaded. Used by `draftfeed plan` and by anyone who wants to judge a max_len / world_size choice.
#pragma once

#include <cstdint>
#include <span>

#include "draftfeed/sampler/multipack.h"

namespace draftfeed {

// Max and min over the ranks of one per-rank total; ratio = max / min (0 when min is 0).
struct RankSpread {
  std::int64_t max = 0;
  std::int64_t min = 0;
  double ratio = 0;
};

struct PlanSummary {
  std::int64_t batches_per_rank = 0;
  std::int64_t planned_tokens = 0;  // tokens of planned samples, lengths clipped to max_len
  // Tokens of one rank's batch as a percent of max_len, over every (rank, batch): mean and min.
  // Both 0 when there are no batches.
  double fill_mean_percent = 0;
  double fill_min_percent = 0;
  RankSpread tokens_per_rank;
  RankSpread samples_per_rank;
};

// `lengths` and `max_len` must be the ones the plan was made from.
PlanSummary summarize_plan(const AllRanksPlan& plan, std::span<const std::int64_t> lengths,
                           std::int64_t max_len);

}  // namespace draftfeed
