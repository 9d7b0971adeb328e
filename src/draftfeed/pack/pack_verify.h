// `draftfeed verify` of a packed cache: every sample the manifest names read back (its shard
// opened and indexed, its checksum checked, its parts against its own header, compressed parts
// decoded) and checked against its dataset row as a per-sample file is (validate.h: token ids,
// dtype, shape, values). A row is counted by what the loader would read: its packed sample, or,
// when that fails, its per-sample file (the loader's fallback: a row `draftfeed generate`
// repaired), counted as ok and listed among the fallbacks with why its packed sample failed; a
// row with neither is counted by the packed sample's problem (the same statuses as cache_scan.h's),
// each naming the shard, the offset and the row.
#pragma once

#include <functional>

#include "draftfeed/hidden/cache_scan.h"
#include "draftfeed/pack/packed_cache.h"

namespace draftfeed {

struct PackVerifyReport {
  CacheScanReport scan;      // counts, examples, bytes (the samples' bytes in their shards)
  std::int64_t samples = 0;  // in the manifest
  std::int64_t shards = 0;
  std::int64_t compressed = 0;  // samples whose hidden states are stored compressed
  std::int64_t packed_ok = 0;   // rows read from their packed sample
  // Rows read from their per-sample file because their packed sample fails (counted ok), with the
  // first examples: the packed sample's problem.
  std::int64_t fallbacks = 0;
  std::vector<ScanExample> fallback_examples;
};

// Checks every sample of `pack`; a row at or past `num_rows` is corrupt (the pack is of another
// dataset). `ids_of_row` as for scan_cache. `files` (give it LockMode::kProbe; may be null) is
// where the fallbacks are looked for: the pack's folder as a per-sample cache.
PackVerifyReport verify_pack(const PackedCache& pack, std::int64_t num_rows,
                             const std::function<RowIds(std::int64_t)>& ids_of_row,
                             unsigned threads, std::size_t max_examples,
                             const CacheStore* files = nullptr);

}  // namespace draftfeed
