#include "draftfeed/pipeline/epoch_plan.h"

namespace draftfeed {

std::vector<PlannedBatch> planned_batches(const RankPlan& plan, const DatasetSplit& split) {
  std::vector<PlannedBatch> batches(static_cast<std::size_t>(plan.num_batches()));
  for (std::int64_t b = 0; b < plan.num_batches(); ++b) {
    PlannedBatch& batch = batches[static_cast<std::size_t>(b)];
    batch.index = b;
    for (const std::int64_t local : plan.batch(b)) batch.rows.push_back(split.global_row(local));
  }
  return batches;
}

}  // namespace draftfeed
