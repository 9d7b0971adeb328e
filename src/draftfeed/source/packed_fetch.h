// The cache source's packed rows (docs/formats.md, "Packed caches"): when the cache folder holds a
// manifest.json, the rows it names are served from their shards (pack/packed_cache.h), the others
// from their per-sample files as before (rows generated or cached after the pack).
//
// A packed row is checked as a per-sample file is (token ids, dtype, shape; values inside the
// copy), after its checksum (on its first read); a corrupt or truncated shard or sample is a
// dropped row (kInvalid) whose message names the shard, the offset and the row. The copy takes
// uncompressed rows from the shard's mapping. Compressed hidden states, for a source whose samples
// go to the batch copy (CompressedRead::kInCopy), are left in the mapping and decoded by the copy,
// the codec chunks of its rows only (batch/compressed_rows_copy.h); else, and on a sample's first
// read (its checksums checked), decoded whole into a buffer of the sample's own.
#pragma once

#include <memory>
#include <vector>

#include "draftfeed/pack/live_packed_cache.h"
#include "draftfeed/pack/packed_cache.h"
#include "draftfeed/read_ahead/file_read_ahead.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

// The pack in `hidden_states_path` as it is now and after each rewrite (pack/live_packed_cache.h).
// Throws the Error of a manifest that does not parse (kFormat naming the manifest and the field):
// a cache half described is not read.
std::shared_ptr<LivePackedCache> open_packed_cache(const std::string& hidden_states_path);

// Whether a fetch's drop may come from a rewrite that finished meanwhile (the row found nowhere,
// or its pack's shard gone): then the source looks at the manifest again (one stat) and, when the
// pack changed, fetches the row once more from the new one.
bool drop_may_be_a_rewrite(const FetchOutcome& outcome);

// `row` (named by the pack's manifest) from its shard.
FetchOutcome fetch_packed(const PackedCache& pack, const PackEntry& entry,
                          const IntArrayView& input_ids, DType fp8_dequantize_dtype,
                          CompressedRead compressed = CompressedRead::kWhole);

// `outcome` with its hidden states decoded whole when they were left compressed
// (FetchedSample::compressed), for a reader of `hidden.data` other than the batch copy; a blob that
// does not decode is a dropped row (kInvalid) naming the shard, the offset and the row.
FetchOutcome decoded_whole(FetchOutcome outcome);

// For the file read-ahead (FileReadAhead::RangeOf): a packed row's bytes in its shard (the shard
// opened once, by the pack), so that it is read ahead by range and no file of its own is looked
// for (a metadata operation each, which the pack is there to save). The pack current when the
// read-ahead asks (refreshed at each epoch's start).
FileReadAhead::RangeOf packed_range_of(std::shared_ptr<const LivePackedCache> pack);

}  // namespace draftfeed
