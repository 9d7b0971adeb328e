// `draftfeed pack` and `draftfeed unpack`: a per-sample hidden-state cache into a packed one
// (docs/formats.md, "Packed caches") and back.
//
// Packing reads rows in order (under the lock protocol without waiting: a file whose writer holds
// its lock stays per-sample), checks each file as `draftfeed verify` does (a file that fails is
// left as it is and counted), encodes the valid ones on a pool of threads and appends them to the
// current shard, held in memory until it reaches `shard_bytes` of per-sample files. A full shard
// is written durably (temporary file, fsync, rename, fsync of the folder), then the manifest naming
// it (the same way), and only then, in place, the per-sample files it holds are removed. A pack
// killed at any point therefore leaves the per-sample files, or a manifest whose shards are all
// there (and the rows it lacks still per-sample): a reader finds every valid row. Running it again
// goes on from the manifest: rows it names are skipped (in place, their leftover per-sample files
// removed), temporary files of dead packers removed, a shard file the manifest does not name
// (killed between its rename and the manifest's) written over.
//
// Unpacking writes each sample's per-sample file back, byte for byte (checksum checked, parts
// decoded), atomically, in the layout it was packed from; in place, the manifest is removed once
// every file is durable, then the shards.
// Thread safety: one pack or unpack at a time per folder; `progress` may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "draftfeed/hidden/cache_scan.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/pack/plane_codec.h"

namespace draftfeed {

inline constexpr std::uint64_t kDefaultShardBytes = std::uint64_t{1} << 30;

struct PackOptions {
  std::string target_root;                         // empty: in place, into the source store's root
  std::uint64_t shard_bytes = kDefaultShardBytes;  // per-sample bytes per shard (memory bound)
  bool compress = false;                           // hidden states through the plane codec
  PlaneCodecOptions codec;
  unsigned threads = 0;  // 0: one per core
  std::size_t max_examples = 5;
};

struct PackProgress {
  std::atomic<std::int64_t> rows_done{0};
  std::atomic<std::uint64_t> bytes_before{0};
  std::atomic<std::uint64_t> bytes_after{0};
};

struct PackReport {
  std::int64_t rows = 0;
  std::int64_t packed = 0;          // written into shards by this run
  std::int64_t already_packed = 0;  // named by the manifest before
  std::int64_t missing = 0;
  std::int64_t removed = 0;          // per-sample files removed (in place)
  std::int64_t shards = 0;           // written by this run
  std::int64_t manifest_writes = 0;  // by this run (kManifestRewriteFactor)
  std::array<std::int64_t, kScanStatusCount> skipped{};
  std::array<std::vector<ScanExample>, kScanStatusCount> examples;
  std::uint64_t bytes_before = 0;   // per-sample files packed by this run
  std::uint64_t bytes_after = 0;    // the shards written by this run
  std::uint64_t hidden_before = 0;  // their hidden states' bytes, as they were
  std::uint64_t hidden_after = 0;   // and as stored
  double seconds = 0;
  unsigned threads = 0;
  std::int64_t skipped_total() const;
};

// The manifest names every sample of the pack, so rewriting it after every shard would cost
// O(samples^2) bytes over a pack of many small shards (10^6 samples: a manifest of about 100 MB).
// It is rewritten once the shards written since its last write hold at least this many times its
// bytes (and at the end): its writes then cost at most 1/kManifestRewriteFactor of the shards'.
// Shards not yet named are not read (a killed pack leaves their rows' per-sample files, which are
// removed, in place, only once a manifest naming them is durable; the next run writes them again).
inline constexpr std::uint64_t kManifestRewriteFactor = 16;

// Packs rows [begin, end) of `source` (give it LockMode::kProbe). `ids_of_row` as for scan_cache.
// Throws Error: kIo naming the file when a write fails (what was written stays usable), kFormat
// when the target's manifest is bad (nothing is written then).
PackReport pack_cache(const CacheStore& source, std::int64_t begin, std::int64_t end,
                      const std::function<RowIds(std::int64_t)>& ids_of_row,
                      const PackOptions& options, PackProgress* progress = nullptr);

struct UnpackReport {
  std::int64_t rows = 0;     // in the manifest
  std::int64_t written = 0;  // per-sample files written
  std::int64_t failed = 0;   // samples that did not read back (corrupt): the pack stays
  std::vector<std::string> examples;
  bool removed_pack = false;       // in place: manifest and shards removed
  std::uint64_t bytes_before = 0;  // the shards
  std::uint64_t bytes_after = 0;   // the per-sample files
  double seconds = 0;
};

// Unpacks the pack in `root` into `target_root` (empty: in place). Throws Error(kNotFound) when
// `root` has no manifest, kIo when a write fails.
UnpackReport unpack_cache(const std::string& root, const std::string& target_root, unsigned threads,
                          std::size_t max_examples = 5, PackProgress* progress = nullptr);

}  // namespace draftfeed
