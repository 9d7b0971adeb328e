// One writer per folder, on one host or many: the writer lock of a cache folder
// (docs/formats.md, "The writer lock").
//
// Every rewrite of a cache folder (pack, unpack, quantize, generate into a packed cache, the online
// source keeping what it generated in a pack) holds this lock while it changes the folder, so that
// two rewrites never interleave. Readers (training, verify) never take it and are never blocked.
//
// The lock is an fcntl open-file-description lock (F_OFD_SETLK; F_SETLK on kernels without OFD
// locks) on `<folder>/.draftfeed-writer.lock`, opened relative to the folder's own descriptor
// (O_NOFOLLOW: a link there is refused), not by a path that could be swapped meanwhile. Why fcntl
// and not flock: fcntl locks are the ones every shared file system forwards to its server or lock
// manager (NFS v3 through lockd, NFS v4 in the protocol, Lustre mounted with `flock`, CephFS, GPFS,
// BeeGFS with global locks), while flock is local to the client on several of them. A process that
// dies releases it (its descriptors close); on NFS a host that dies releases it when its lease ends
// (90 s by default for v4).
//
// Where a mount is known to keep locks local to the client (NFS with `nolock` or `local_lock=posix`
// or `all`, Lustre with `localflock`), two hosts could both hold the lock: acquiring refuses with
// a message naming the mount option, unless DRAFTFEED_WRITER_LOCK=local says one host writes. A
// file system that refuses locks (Lustre with `noflock`) is refused likewise unless
// DRAFTFEED_WRITER_LOCK=off, at the user's risk.
//
// The holder writes who it is (host, pid, what it does, since when) into the lock file, so that a
// writer that finds the lock held can name it. The lock file is never removed (removing it would
// let a third writer lock a new file while the second holds the old one).
// Thread safety: a FolderLock is used by one thread at a time.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "draftfeed/common/error.h"
#include "draftfeed/common/held_file.h"

namespace draftfeed {

inline constexpr const char* kWriterLockName = ".draftfeed-writer.lock";

// Who holds a folder's writer lock, as the holder wrote it.
struct LockHolder {
  std::string host;
  long pid = 0;
  std::string what;   // "draftfeed pack", ...
  std::string since;  // UTC, ISO 8601
  // "host h, pid p (draftfeed pack, since t)": for messages (names escaped).
  std::string text() const;
};

class FolderLock {
 public:
  // Takes the writer lock of the folder `path` (which must exist), trying every `poll` until
  // `wait` has passed (zero: once). `what` says what the holder does, for the next writer's
  // message. Errors: kTimeout naming the folder and the holder ("is being rewritten by ...") when
  // another writer holds it; kNotFound when the folder does not exist; kUnsupported when its file
  // system keeps locks local or refuses them (see above); kIo for the OS's other refusals.
  static Result<FolderLock> acquire(
      const std::string& path, const std::string& what, std::chrono::duration<double> wait,
      std::chrono::duration<double> poll = std::chrono::milliseconds(100));

  FolderLock(FolderLock&&) noexcept = default;
  FolderLock& operator=(FolderLock&&) noexcept = default;
  ~FolderLock() = default;  // closing the lock file's descriptor releases the lock

  const std::string& path() const { return path_; }
  // The folder's descriptor, opened once: a holder writes through it (openat, renameat, unlinkat),
  // never through a path that could name another folder meanwhile.
  int folder() const { return folder_.get(); }
  const FileIdentity& folder_identity() const { return identity_; }
  // Whether the lock is really exclusive across hosts (false with DRAFTFEED_WRITER_LOCK=local or
  // off, where the mount would not make it so).
  bool across_hosts() const { return across_hosts_; }
  // How long acquire waited for it.
  double waited_seconds() const { return waited_seconds_; }

 private:
  FolderLock() = default;
  UniqueFd folder_;
  UniqueFd lock_;
  std::string path_;
  FileIdentity identity_;
  bool across_hosts_ = true;
  double waited_seconds_ = 0;
};

// Who holds the writer lock of `path` now, without taking it; nothing when nobody does (or the
// folder has no lock file). For `draftfeed verify` and messages.
std::optional<LockHolder> folder_lock_holder(const std::string& path);

}  // namespace draftfeed
