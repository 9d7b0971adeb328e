// Reading the file a server names in its response (a generation *handle*), safely
// (docs/protocol.md, "Generated files"):
//   * with a server folder, the handle must resolve (links and `..` followed) strictly inside it,
//     else kOutsideServerDir; without one, any path is read;
//   * a handle naming one of the cache's own files (`hs_*` / `.hs_*` in the cache root or one of
//     its shard folders) is refused (kCacheFile): a server must not make the loader validate, move
//     or delete them;
//   * only a regular file of at most `max_file_bytes` is opened;
//   * a handle that is itself a symbolic link is read through, but never owned nor proven;
//   * the lock protocol applies; the lock file is removed (as the reference does) only when the
//     file is *owned*, i.e. inside the cache root or the server folder; for any other file the
//     reader waits for the writer's lock without removing anything;
//   * then the sample is validated against the row (validate.h: keys, ids, shape, finiteness).
// A file that passed is *proven*: a regular file (not a link) that parsed as a hidden-state file
// whose token ids equal the prompt that was sent, read under the lock protocol: this request's
// output, wherever the server put it. The reference deletes (or caches) every generated file it
// read; draftfeed does so with proven files (release_generated below), and with failed files only
// when they are owned. Anything else a handle names is never moved or removed.
//
// Thread safety: `read` may be called from any number of threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

enum class FileProblem : std::uint8_t {
  kNone,
  kOutsideServerDir,  // the handle resolves outside the server folder
  kCacheFile,         // the handle names a file of the cache itself
  kMissing,           // no file at the handle (after the lock protocol)
  kNotRegular,        // a folder, a device, a FIFO...
  kTooLarge,          // larger than max_file_bytes
  kLockTimeout,       // the writer held the lock past the lock timeout
  kUnreadable,        // the OS refused to open or map it
  kCorrupt,           // not a valid safetensors file, or a key is missing
  kTokenMismatch,     // token_ids differ from the row's ids
  kBadShape,          // token_ids / hidden_states of the wrong dtype or shape
  kNonFinite,         // NaN or Inf in hidden_states
  kTransferFailed,    // a non-file transfer could not load the sample (hidden_states_transfer.h)
  kCount,
};

// "ok", "outside server dir", "cache file", "missing file", "not a regular file", "file too large",
// "lock timeout", "unreadable", "corrupt", "token mismatch", "bad shape", "non-finite",
// "transfer failed".
const char* file_problem_name(FileProblem problem);

struct GeneratedFileOptions {
  std::string server_dir;  // empty: handles may point anywhere
  std::uint64_t max_file_bytes = std::uint64_t{64} << 30;
  std::chrono::duration<double> lock_timeout{10.0};
  std::chrono::duration<double> lock_poll{0.1};
};

struct GeneratedFile {
  FileProblem problem = FileProblem::kNone;
  std::string message;  // names the handle, what it resolves to and the numbers that disagree
  std::string path;     // the handle resolved (empty when it could not be)
  bool owned = false;   // inside the cache root or the server folder: may be moved or deleted
  bool proven = false;  // this request's output (see above): may be moved or deleted
  std::uint64_t device = 0, inode = 0;      // what `path` was when read (checked before removal)
  std::optional<HiddenStateSample> sample;  // when problem == kNone
  bool ok() const { return problem == FileProblem::kNone; }
};

class GeneratedFileReader {
 public:
  // `cache` is the hidden-state cache; its allowed folders must include the server folder (if any).
  GeneratedFileReader(std::shared_ptr<const CacheStore> cache, GeneratedFileOptions options);

  GeneratedFile read(const std::string& handle, const RowIds& ids, std::int64_t row) const;

 private:
  std::shared_ptr<const CacheStore> cache_;
  std::optional<CacheStore> server_;  // confinement to the server folder
  GeneratedFileOptions options_;
};

// Moves a proven generated file into the cache as `row`'s file (on_generate = cache: a rename on
// one file system, else copy, fsync, rename and removal of the source) or removes it (delete), with
// its released lock file, as the reference does. Refuses (kInvalidArgument) a file that is neither
// proven nor owned, or whose path now names another file than the one read. Throws Error (kIo)
// when the OS refuses.
void release_generated(const CacheStore& cache, const GeneratedFile& file,
                       std::optional<std::int64_t> cache_row);

// Waits (polling a shared, non-blocking flock) until no writer holds `lock_path`, never creating
// or removing it: for files the loader does not own. Returns kTimeout after `timeout`.
std::optional<Error> wait_for_foreign_lock(const std::string& lock_path,
                                           std::chrono::duration<double> timeout,
                                           std::chrono::duration<double> poll);

}  // namespace draftfeed
