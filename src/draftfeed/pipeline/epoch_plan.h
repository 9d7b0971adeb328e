// Turning a rank's plan (split-local sample indices) into the pipeline's batches (global rows).
#pragma once

#include <vector>

#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/pipeline/pipeline.h"
#include "draftfeed/sampler/multipack.h"

namespace draftfeed {

std::vector<PlannedBatch> planned_batches(const RankPlan& plan, const DatasetSplit& split);

}  // namespace draftfeed
