// The pack of a cache folder as it is now, for a reader that runs while the folder is rewritten
// (docs/formats.md, "A rewrite under a running loader").
//
// A rewrite (pack, unpack, quantize, the online source keeping what it generated) replaces the
// manifest by a rename, and never changes a shard the manifest names: a pack appends shards and
// names them in a new manifest; an unpack writes the per-sample files back, removes the manifest,
// then the shards. So a reader that keeps the stamp of the manifest it read (pack_manifest.h) can
// tell with one stat whether the pack changed, and read the new one, borrowing the shards it has
// open (PackedCache::open's `previous`). Samples fetched from the old pack keep its mappings (their
// owner holds the shard), so what a running epoch holds stays valid until it is done with it, even
// once unpack removed the files.
//
// A source refreshes at each epoch's start, and again when a row is found nowhere or its shard is
// gone (a rewrite that finished during the epoch): no epoch silently misses a row the folder holds.
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "draftfeed/pack/packed_cache.h"

namespace draftfeed {

class LivePackedCache {
 public:
  // Reads the folder's manifest now. Throws the Error of a manifest that does not parse (a cache
  // half described is not read).
  explicit LivePackedCache(std::string root);

  const std::string& root() const { return root_; }
  // The pack as last read (null: the folder had no pack then).
  std::shared_ptr<const PackedCache> current() const;

  // Looks at the manifest (one stat), reads it again when it changed since the current pack's was
  // read, and returns the pack current then: a caller holding another one (compare the pointers)
  // retries with it. A manifest that no longer parses is an Error (kFormat naming it, and saying
  // it changed while this reader ran); the previous pack stays current then.
  Result<std::shared_ptr<const PackedCache>> refresh();
  // How many times refresh read a new manifest.
  std::int64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }

 private:
  std::string root_;
  mutable std::mutex mutex_;  // guards current_; held while a new manifest is read
  std::shared_ptr<const PackedCache> current_;
  FileStamp stamp_;  // of the manifest current_ was read from (exists false: none)
  std::atomic<std::int64_t> reloads_{0};
};

}  // namespace draftfeed
