// Turning a rank's plan (split-local sample indices) into the pipeline's batches (global rows).
#pragma once

#include <cstdint>
#include <optional>

#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/pipeline/pipeline.h"
#include "draftfeed/sampler/multipack.h"

namespace draftfeed {

std::vector<PlannedBatch> planned_batches(const RankPlan& plan, const DatasetSplit& split);

// The hidden-state geometry of a cache, read from the first readable file among the split's rows:
// layers L and hidden size H. Nothing when no file could be read.
struct CacheGeometry {
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
};
std::optional<CacheGeometry> probe_cache_geometry(const std::string& hidden_states_path,
                                                  const DatasetSplit& split,
                                                  std::int64_t max_probes = 64);

}  // namespace draftfeed
