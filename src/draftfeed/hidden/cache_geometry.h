// The hidden-state geometry of a cache (layers L and hidden size H), read from its first readable
// file: `draftfeed bench` and `demo` size their batches from it when the user gives no sizes.
// Read-only, like the whole-cache scan (cache_scan.h): the lock protocol's probe mode, so a file
// being written is passed over and no lock file is removed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {

struct CacheGeometry {
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
};

// From the first readable file among the split's first `max_probes` rows; nothing when none could
// be read.
std::optional<CacheGeometry> probe_cache_geometry(const std::string& hidden_states_path,
                                                  const DatasetSplit& split,
                                                  std::int64_t max_probes = 64);

}  // namespace draftfeed
