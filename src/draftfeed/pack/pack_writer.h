// `draftfeed pack` and `draftfeed unpack`: a per-sample hidden-state cache into a packed one
// (docs/formats.md, "Packed caches") and back. Both are cache rewrites (hidden/cache_rewrite.h):
// the folder they write is locked for the whole run, so that two never interleave.
//
// Packing reads rows in order (under the lock protocol without waiting: a file whose writer holds
// its lock stays per-sample), checks each file as `draftfeed verify` does (a file that fails is
// left as it is and counted), encodes the valid ones on a pool of threads and appends them to the
// current shard, held in memory until it reaches `shard_bytes` of per-sample files. A full shard
// is written durably (temporary file, fsync, rename, fsync of the folder), then, when its turn has
// come, the manifest naming it (the same way), and only then, in place, the per-sample files it
// holds are removed, each only once its packed sample reads back valid (checksum and every check
// verify makes). A pack killed at any point therefore leaves the per-sample files, or a manifest
// whose shards are all there (and the rows it lacks still per-sample): a reader finds every valid
// row. Running it again goes on from the manifest: rows it names are skipped; in place, a row the
// manifest names whose per-sample file is still there (left by a killed run, or written since to
// repair a corrupt packed sample) has its file removed only when its packed sample is valid, and
// is packed again from the file (into a new shard, the manifest then naming that one) when it is
// not. Temporaries of dead packers of this host are removed; a shard file the manifest does not
// name (killed between its rename and the manifest's) is written over.
//
// Unpacking writes each sample's per-sample file back, byte for byte (checksum checked, parts
// decoded), atomically, in the layout it was packed from; in place, the manifest is removed once
// every file is durable, then the shards.
// Thread safety: `progress` may be read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "draftfeed/hidden/cache_rewrite.h"
#include "draftfeed/hidden/cache_scan.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/pack/plane_codec.h"

namespace draftfeed {

inline constexpr std::uint64_t kDefaultShardBytes = std::uint64_t{1} << 30;

struct PackOptions {
  CacheRewriteOptions rewrite;  // target (empty: in place), threads, examples, lock wait
  std::uint64_t shard_bytes = kDefaultShardBytes;  // per-sample bytes per shard (memory bound)
  bool compress = false;                           // hidden states through the plane codec
  PlaneCodecOptions codec;

  // The only check of these fields: Error(kInvalidArgument) naming the field.
  void validate() const;
};

struct PackReport : CacheRewriteReport {
  std::int64_t packed = 0;          // written into shards by this run
  std::int64_t already_packed = 0;  // named by the manifest before, and left there
  std::int64_t repacked = 0;        // of `packed`, rows whose packed sample was not valid
  std::int64_t missing = 0;
  std::int64_t removed = 0;  // per-sample files removed (in place), each row safe in the pack
  // Per-sample files kept (in place) because their packed sample did not read back valid: the row
  // reads from its file still. Counted among the skipped rows too (by reason, with examples).
  std::int64_t kept = 0;
  std::int64_t shards = 0;           // written by this run
  std::int64_t manifest_writes = 0;  // by this run (kManifestRewriteFactor)
  // bytes_before: the per-sample files packed by this run; bytes_after: the shards it wrote.
  std::uint64_t hidden_before = 0;  // their hidden states' bytes, as they were
  std::uint64_t hidden_after = 0;   // and as stored
};

// PackReport's own fields under their reported names (common/stats_tree.h; CacheRewriteReport's
// are the rewrite commands' one report of them).
template <typename Visit>
void for_each_stat(const PackReport& r, Visit&& visit) {
  visit("packed", r.packed);
  visit("already_packed", r.already_packed);
  visit("repacked", r.repacked);
  visit("missing", r.missing);
  visit("kept", r.kept);
  visit("shards", r.shards);
  visit("manifest_writes", r.manifest_writes);
  visit("removed", r.removed);
  visit("hidden_before", r.hidden_before);
  visit("hidden_after", r.hidden_after);
}

// The manifest names every sample of the pack, so rewriting it after every shard would cost
// O(samples^2) bytes over a pack of many small shards (10^6 samples: a manifest of about 100 MB).
// It is rewritten once the shards written since its last write hold at least this many times its
// bytes (and at the end): its writes then cost at most 1/kManifestRewriteFactor of the shards'.
// Shards not yet named are not read (a killed pack leaves their rows' per-sample files, which are
// removed, in place, only once a manifest naming them is durable; the next run writes them again).
inline constexpr std::uint64_t kManifestRewriteFactor = 16;

// Packs rows [begin, end) of `source` (give it LockMode::kProbe). `ids_of_row` as for scan_cache.
// Throws the writer lock's Error when another rewrite holds the folder (kTimeout naming it),
// Error kIo naming the file when a write fails (what was written stays usable), kFormat when the
// target's manifest is bad (nothing is written then), kRuntime when the manifest changed under
// this pack (a writer that did not take the lock: this one stops before writing over it).
PackReport pack_cache(const CacheStore& source, std::int64_t begin, std::int64_t end,
                      const std::function<RowIds(std::int64_t)>& ids_of_row,
                      const PackOptions& options, CacheRewriteProgress* progress = nullptr);

struct UnpackReport : CacheRewriteReport {
  std::int64_t written = 0;  // per-sample files written
  // Samples that did not read back (corrupt): skipped[kCorrupt], with examples; the pack stays.
  std::int64_t failed() const { return skipped[static_cast<std::size_t>(ScanStatus::kCorrupt)]; }
  bool removed_pack = false;  // in place: manifest and shards removed
  // bytes_before: the shards; bytes_after: the per-sample files.
};

template <typename Visit>
void for_each_stat(const UnpackReport& r, Visit&& visit) {
  visit("written", r.written);
  visit("failed", r.failed());
  visit("removed_pack", r.removed_pack);
}

// Unpacks the pack in `root` into options.target_root (empty: in place). Throws the writer lock's
// Error, Error(kNotFound) when `root` has no manifest, kIo when a write fails.
UnpackReport unpack_cache(const std::string& root, const CacheRewriteOptions& options,
                          CacheRewriteProgress* progress = nullptr);

}  // namespace draftfeed
