// The hidden-state cache: `<root>/hs_<i>.safetensors`, keyed by the global row index
// (docs/formats.md), or draftfeed's sharded layout `<root>/<i // 1000>/hs_<i>.safetensors`
// (cache_layout.h).
//
// Reading looks for each row's file in both layouts, file by file (a cache may be half migrated):
// first in the layout where the previous file was found (so a cache in one layout costs one lookup
// per file, on a network file system one round trip), then in the other. Writing (path_for,
// adopt) uses the layout of the options.
//
// Reading follows the producer's lock protocol, byte-compatible with hs_connectors.FileTransfer:
// when `<file>.lock` exists, open it read-write, try a non-blocking flock(LOCK_EX) every
// `lock_poll` until `lock_timeout` (then kTimeout naming the lock file); once it is ours, close it
// and remove the lock file, then read the data file if it exists. Where the folder refuses the
// removal (read-only, another user's) the lock file stays and the read goes on: unlike the
// reference, which raises there, a read-only cache with leftover lock files stays readable.
// `LockMode::kProbe` is for read-only scans (`draftfeed verify`): it never waits and never removes
// a lock file; a lock held by a writer is reported at once as kTimeout ("locked"), a stale one (no
// holder) is left alone and the data file is read as usual.
//
// adopt/load/remove take paths from the store's user (not from a server) and act only inside the
// folders the store was given (the root plus `allowed_folders`), checked after resolving symbolic
// links and `..`. Files a server names are never handled by name here: source/generated_file.h
// holds them by descriptor and moves them with adopt_held.
//
// Thread safety: every method is const and may be called from any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/held_file.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/hidden_state_sample.h"

namespace draftfeed {

enum class LockMode {
  kWait,   // the reference's protocol: wait for the writer, then remove the lock file
  kProbe,  // never wait, never remove: a held lock is an immediate kTimeout error
};

struct CacheStoreOptions {
  std::string root;                          // folder of the hs_<i>.safetensors files
  CacheLayout layout = CacheLayout::kFlat;   // where new files are written (reads try both)
  std::vector<std::string> allowed_folders;  // more folders adopt/remove/load may touch
  std::chrono::duration<double> lock_timeout{10.0};
  std::chrono::duration<double> lock_poll{0.1};  // the longest interval between lock attempts
  LockMode lock_mode = LockMode::kWait;
  // Test hook: make adopt() take its cross-file-system path (copy, fsync, rename) even when a
  // rename would work.
  bool force_copy_on_adopt = false;

  // The only check of these fields (Error kInvalidArgument naming the field): a root, a lock
  // timeout >= 0, a poll interval > 0.
  void validate() const;
};

// Applies the lock protocol to `lock_path` (see above). Returns nothing when the data file may be
// read (no lock file, a released one, or a stale one), else the error: kTimeout when a writer held
// it past `timeout` (kWait) or holds it now (kProbe), kIo when the OS refused. A held lock is asked
// for again with a growing interval of at most `poll` (common/poll_backoff.h); `attempts`, if
// given, counts the flock calls.
std::optional<Error> wait_for_lock(const std::string& lock_path,
                                   std::chrono::duration<double> timeout,
                                   std::chrono::duration<double> poll,
                                   LockMode mode = LockMode::kWait,
                                   std::int64_t* attempts = nullptr);

class CacheStore {
 public:
  explicit CacheStore(CacheStoreOptions options);

  const std::string& root() const { return options_.root; }
  const CacheStoreOptions& options() const { return options_; }

  // Where `row`'s file is written: `<root>/hs_<row>.safetensors`, or in its shard folder.
  std::string path_for(std::int64_t row) const;
  // path_for(row), after creating its folder (the root, or the root and the shard folder). Throws
  // Error(kIo) naming the folder when it cannot be created.
  std::string path_for_writing(std::int64_t row) const;
  // Both places a reader looks, for messages: "<flat path> (or <sharded path>)".
  std::string paths_text(std::int64_t row) const;

  // The cached sample of `row`, from its file in either layout: nothing when there is none (after
  // the lock protocol), an error when the lock timed out (kTimeout), the file is corrupt or lacks a
  // key (kFormat), or the OS refused (kIo). Token ids, shapes and values are not checked here (see
  // validate.h). `map`: how the file is mapped (MappedFile::open; the loader's sources and the
  // prefetch read rows through the kept descriptor: kMapForRowReads).
  Result<std::optional<HiddenStateSample>> lookup(std::int64_t row, MapOptions map = {}) const;

  // Same for a file a server wrote (a generation handle): the lock protocol, then the file.
  // The path must lie inside the allowed folders (kInvalidArgument otherwise), since the lock
  // protocol deletes the lock file beside it.
  Result<std::optional<HiddenStateSample>> load(const std::string& path, MapOptions map = {}) const;

  // Moves `source` (inside the allowed folders, not a link) to `path_for(row)` atomically,
  // creating the root: a rename, or across file systems a copy to a temporary file in the root,
  // fsync, rename, and removal of the source (HeldFile::move_to: what was opened is what moves). A
  // reader never sees half a file. Replaces an existing cached file. Does not wait for the
  // source's lock: load() and validate it first. Throws Error: kInvalidArgument for a source
  // outside the allowed folders, kNotFound for a missing source, kIo otherwise.
  void adopt(std::int64_t row, const std::string& source) const;
  // The same for a file already held by its descriptors (a generated file that may be moved, see
  // source/generated_file.h): returns the error instead of throwing it.
  std::optional<Error> adopt_held(std::int64_t row, const HeldFile& source) const;

  // Removes the adopt temporaries (`.hs_<row>.safetensors.adopt-<host>-<pid>-<n>` in the root or
  // a shard folder) that a process of this host left behind when it was killed mid-copy: those
  // whose pid no longer runs. A temporary of a live process, or of another host sharing the folder,
  // is left alone. They are never read as samples (not an hs_<row> name); this only frees their
  // space. Returns how many were removed; a missing root is no error.
  std::int64_t remove_stale_temporaries() const;

  // After `row`'s file was written at path_for(row): removes its file in the other layout, if any,
  // so that no reader finds the older one first. Throws Error(kIo) when the OS refuses.
  void remove_other_layout(std::int64_t row) const;

  // Deletes `path`, which must lie inside the allowed folders (kInvalidArgument otherwise).
  // A missing file is not an error. Throws Error(kIo) when the OS refuses.
  void remove(const std::string& path) const;

  // `path` with links and `..` resolved, if it lies strictly inside the root or an allowed folder;
  // else Error(kInvalidArgument) naming the path, what it resolves to and the allowed folders.
  Result<std::string> confine(const std::string& path) const;

 private:
  Result<std::optional<HiddenStateSample>> read_with_lock(const std::string& path,
                                                          MapOptions map) const;

  CacheStoreOptions options_;
  // The layout the latest file was found in: tried first by the next lookup.
  mutable std::atomic<std::uint8_t> found_in_{0};
};

}  // namespace draftfeed
