#include "draftfeed/hidden/cache_geometry.h"

#include "draftfeed/hidden/cache_store.h"

namespace draftfeed {

std::optional<CacheGeometry> probe_cache_geometry(const std::string& hidden_states_path,
                                                  const DatasetSplit& split,
                                                  std::int64_t max_probes) {
  CacheStoreOptions options;
  options.root = hidden_states_path;
  options.lock_mode = LockMode::kProbe;
  const CacheStore store(options);
  for (std::int64_t i = 0; i < split.num_rows() && i < max_probes; ++i) {
    auto found = store.lookup(split.global_row(i));
    if (!found.ok() || !found.value()) continue;
    const auto& shape = found.value()->hidden_states.shape;
    if (shape.size() == 3) return CacheGeometry{shape[1], shape[2]};
  }
  return std::nullopt;
}

}  // namespace draftfeed
