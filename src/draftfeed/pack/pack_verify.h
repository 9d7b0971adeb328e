// `draftfeed verify` of a packed cache: every sample the manifest names read back (its shard
// opened and indexed, its checksum checked, compressed parts decoded) and checked against its
// dataset row as a per-sample file is (validate.h: token ids, dtype, shape, values), counted by the
// same statuses as cache_scan.h's, each problem naming the shard, the offset and the row.
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
};

// Checks every sample of `pack`; a row at or past `num_rows` is corrupt (the pack is of another
// dataset). `ids_of_row` as for scan_cache.
PackVerifyReport verify_pack(const PackedCache& pack, std::int64_t num_rows,
                             const std::function<RowIds(std::int64_t)>& ids_of_row,
                             unsigned threads, std::size_t max_examples);

}  // namespace draftfeed
