// Reading the file a server names in its response (a generation *handle*), and deciding whether
// draftfeed may ever remove or move it (docs/protocol.md, "Generated files"). A handle is hostile:
// every check is made on the file itself (common/held_file.h), never on its name.
//
// Reading:
//   * the handle must be a plain path to a file (no `.`/`..`/empty component, no trailing `/`);
//   * its folder is opened once; with a server folder, that folder (found by device and inode,
//     walking up through `..`) must be the server folder or lie below it, and so must a link's
//     target; without one, any folder is read;
//   * a cache file name (`hs_*`, `.hs_*`) anywhere under the cache folder is refused (kCacheFile);
//   * the writer's lock `<file>.lock` is waited for (a shared, non-blocking flock), never created
//     nor removed while reading; a lock that is a link, FIFO or anything but a regular file is an
//     error, never a wait;
//   * the file is opened relative to its folder (O_NOFOLLOW | O_NONBLOCK; a link is read through
//     but never removed), must be a regular file of at most `max_file_bytes`, and is mapped from
//     that descriptor, then validated against the row (validate.h).
//
// Removing or moving (`keep_reason`): only the request's output, which draftfeed may remove or
// move into the cache, is a file that
//   * is not a symbolic link and has no other name (one link);
//   * lies neither in the cache folder nor below it (draftfeed removes there only what it wrote);
//   * lies in a folder that holds no cache file names (no other rows' samples: not some cache);
//   * was created after the request was sent, less `clock_skew` (a file that existed before the
//     request is not its output);
//   * and, when it failed validation, lies inside the server folder (without one: never removed).
// Anything else is left where it is and said (`left_in_place`).
//
// Thread safety: `read` may be called from any number of threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "draftfeed/common/held_file.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

enum class FileProblem : std::uint8_t {
  kNone,
  kOutsideServerDir,  // the handle's folder (or a link's target) is outside the server folder
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
  kNotPlainPath,      // the handle is not a plain path to a file
  kCount,
};

// "ok", "outside server dir", "cache file", "missing file", "not a regular file", "file too large",
// "lock timeout", "unreadable", "corrupt", "token mismatch", "bad shape", "non-finite",
// "transfer failed", "not a plain path".
const char* file_problem_name(FileProblem problem);

struct GeneratedFileOptions {
  std::string server_dir;  // empty: handles may point anywhere (but see keep_reason above)
  std::uint64_t max_file_bytes = std::uint64_t{64} << 30;
  std::chrono::duration<double> lock_timeout{10.0};
  std::chrono::duration<double> lock_poll{0.1};
  // How much earlier than the request's sending a file's creation time may read and still count
  // as the request's output: the clocks of the trainer's host and of the file system's server
  // (a shared file system stamps files with its own clock) may differ by this much.
  std::chrono::duration<double> clock_skew{30.0};

  // The only check of these fields (Error kInvalidArgument naming the field).
  void validate() const;
};

struct GeneratedFile {
  FileProblem problem = FileProblem::kNone;
  std::string message;  // names the row, the handle and the numbers that disagree
  std::string path;     // the handle (for messages)
  // The file opened, when it could be: what release_generated / discard act on.
  std::shared_ptr<const HeldFile> held;
  // The handle's folder, opened, and the file's name in it: for a file whose writer held its lock
  // past the timeout (kLockTimeout), which may not exist yet and is opened by a later sweep.
  std::shared_ptr<const UniqueFd> folder;
  PlainPath name;
  // Why draftfeed must leave the file where it is (see above); empty when it may remove or move it.
  std::string keep_reason;
  std::optional<HiddenStateSample> sample;  // when problem == kNone
  bool ok() const { return problem == FileProblem::kNone; }
  bool removable() const { return held != nullptr && keep_reason.empty(); }
};

class GeneratedFileReader {
 public:
  // `cache` is the hidden-state cache (its root is the cache folder of the rules above).
  GeneratedFileReader(std::shared_ptr<const CacheStore> cache, GeneratedFileOptions options);

  // Reads `handle` for `row`, whose request was sent at `request_sent` (the wall clock, before the
  // round trip's first attempt).
  GeneratedFile read(const std::string& handle, const RowIds& ids, std::int64_t row,
                     std::chrono::system_clock::time_point request_sent) const;

  // Why `file` (held, with this problem) must stay where it is, or "" when it may go: the rules
  // above, asked of the file now (a later sweep asks again).
  std::string keep_reason(const HeldFile& file, bool failed,
                          std::chrono::system_clock::time_point request_sent) const;

  const GeneratedFileOptions& options() const { return options_; }

 private:
  // The folders the rules compare with, by identity (nothing where a folder does not exist).
  struct Anchors {
    std::optional<FileIdentity> cache_root;
    std::optional<FileIdentity> server;
  };
  Anchors anchors() const;
  std::string keep_reason(const HeldFile& file, bool failed,
                          std::chrono::system_clock::time_point request_sent,
                          const Anchors& anchors) const;

  std::shared_ptr<const CacheStore> cache_;
  GeneratedFileOptions options_;
};

// Moves a generated file that may go (file.removable()) into the cache as `row`'s file
// (on_generate = cache: a rename, or across file systems a copy of the checked descriptor, fsync
// and rename, then the removal of the source), or removes it (no row: on_generate = delete), then
// its released lock file, as the reference does. Returns the error (nothing moved or removed
// then, unless the message says otherwise): kInvalidArgument for a file that must stay or whose
// name now names another file, kIo when the OS refuses.
std::optional<Error> release_generated(const CacheStore& cache, const GeneratedFile& file,
                                       std::optional<std::int64_t> cache_row);

// Removes `<held>.lock` beside a generated file draftfeed removed or moved: only a regular file
// with one link, which no writer holds, and only while its name still names it.
void remove_released_lock(const HeldFile& held);

// Waits (polling a shared, non-blocking flock) until no writer holds `lock_name` in the folder open
// at `folder` (`shown`: its path, for messages), never creating nor removing it. Opened O_NOFOLLOW
// | O_NONBLOCK: a link, FIFO or other non-regular lock file is kIo at once. kTimeout after
// `timeout`.
std::optional<Error> wait_for_lock_at(int folder, const std::string& lock_name,
                                      const std::string& shown,
                                      std::chrono::duration<double> timeout,
                                      std::chrono::duration<double> poll);

}  // namespace draftfeed
