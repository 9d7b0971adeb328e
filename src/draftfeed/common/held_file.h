// A file named by a path nobody vouches for (a server's generation handle): held by descriptors,
// so that every check, the read and the final removal or move act on the one file that was checked,
// never on whatever its name names a moment later (docs/protocol.md, "Generated files").
//
//   * the path must be plain (split_plain_path): no empty, `.` or `..` component, no trailing `/`,
//     no NUL; a folder and a name;
//   * the folder is opened once (links in the folder's own path are followed: the checks that
//     matter are made on the folder opened, by device and inode, not on its name);
//   * the file is opened relative to that folder with O_NOFOLLOW | O_NONBLOCK (a link is seen as
//     one; a FIFO, socket or device cannot block the open) and fstat must say a regular file;
//   * remove() and move_to() act only while the name still names the device and inode opened: the
//     name is first renamed aside to a name of this process's, checked there, and only then
//     unlinked (or renamed back when it is another file); a copy across file systems reads the
//     descriptor already checked, never the name again.
//
// Thread safety: a HeldFile is used by one thread at a time; the free functions are reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "draftfeed/common/error.h"

namespace draftfeed {

// A descriptor, closed with its owner.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// What a file is, whatever its name: its device and inode.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

// A plain path to a file, split once: `folder` ("." for a bare name) and `name`.
struct PlainPath {
  std::string folder;
  std::string name;
};

// Splits `path`, refusing (kInvalidArgument, saying why) one that is not a plain path to a file:
// empty, a NUL byte, a trailing `/`, an empty component (`a//b`), a `.` or `..` component.
Result<PlainPath> split_plain_path(std::string_view path);

// Opens `path` as a folder (O_DIRECTORY, following links). kNotFound when it does not exist (or a
// component is not a folder), kIo otherwise, the message naming the path.
Result<UniqueFd> open_folder(const std::string& path);

// The identity of an open descriptor (kIo naming `what` when fstat fails).
Result<FileIdentity> identity_of(int fd, const std::string& what);

// True when the folder open at `folder` is `ancestor` or lies below it, found by walking up through
// `..` from the folder itself (device and inode at every step, so links, renames and `..` in any
// name cannot mislead it). A walk that cannot go on (a folder it may not open) answers false.
bool folder_within(int folder, const FileIdentity& ancestor);

// The cache's own file names: `hs_*` (cached samples) and `.hs_*` (the cache's temporaries).
bool is_cache_file_name(std::string_view name);

// True when the folder open at `folder` holds a cache file name (is_cache_file_name) other than
// `except`: a folder of some cache's samples. Reads the folder's names once; false when it cannot.
bool folder_holds_cache_files(int folder, std::string_view except = {});

class HeldFile {
 public:
  // Opens `name` in the folder open at `folder` (whose path, for messages, is `folder_path`):
  // O_NOFOLLOW, unless `follow_link`, in which case a link is opened through and is_link() says
  // so. O_NONBLOCK always. Errors name the path: kNotFound (no such file), kInvalidArgument "is a
  // symbolic link" (a link, not followed), kUnsupported "is not a regular file" (a folder, FIFO,
  // socket or device: opened without blocking and refused), kIo for the OS's other refusals.
  static Result<HeldFile> open(UniqueFd folder, std::string folder_path, std::string name,
                               bool follow_link);

  const std::string& path() const { return path_; }  // folder_path/name, for messages
  const std::string& name() const { return name_; }
  const std::string& folder_path() const { return folder_path_; }
  int folder() const { return folder_.get(); }
  int fd() const { return file_.get(); }
  const FileIdentity& identity() const { return identity_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t links() const { return links_; }
  bool is_link() const { return is_link_; }
  // When the file was created (statx's birth time), or, where the file system keeps none, last
  // changed (ctime): nanoseconds since the epoch on the file system's clock.
  std::int64_t created_ns() const { return created_ns_; }
  bool created_is_birth() const { return created_is_birth_; }

  // Whether the name in the folder still names the file held (not a link, same device and inode).
  bool still_named() const;

  // Removes the file held from its folder, only while its name still names it (see above). A name
  // that now names another file is left as it is: Error kInvalidArgument ("replaced since it was
  // read"). A name already gone: nothing, no error. Other refusals: kIo naming the file.
  std::optional<Error> remove() const;

  // Moves the file held to `target_name` in the folder open at `target_folder` (path for messages
  // `target_path`), replacing what is there atomically: a rename to a temporary name beside the
  // target, checked to be the file held, then a rename over the target. Across file systems: the
  // held descriptor copied to the temporary, fsync'd, renamed, the folder fsync'd, then remove().
  // `temporary` names the temporary file (in the target folder; must not exist). Throws nothing;
  // returns the error naming both files (kInvalidArgument when the name was replaced).
  // `copy`: copy even where a rename would do (a test hook for the path across file systems).
  std::optional<Error> move_to(int target_folder, const std::string& target_path,
                               const std::string& target_name, const std::string& temporary,
                               bool copy = false) const;

 private:
  HeldFile() = default;
  std::optional<Error> checked_unlink_aside() const;

  UniqueFd folder_;
  UniqueFd file_;
  std::string folder_path_;
  std::string name_;
  std::string path_;
  FileIdentity identity_;
  std::uint64_t size_ = 0;
  std::uint64_t links_ = 0;
  std::int64_t created_ns_ = 0;
  bool created_is_birth_ = false;
  bool is_link_ = false;
};

// A name for a temporary file of this process: `<prefix>.<tag>-<host>-<pid>-<n>`, unique in the
// process (a counter) and across hosts sharing a folder.
std::string process_unique_name(const std::string& prefix, const std::string& tag);

// The host's name ("localhost" when it has none), as written in temporary names.
std::string host_name();

// fsync of the folder open at `folder`, ignoring file systems that refuse it.
void fsync_folder_fd(int folder);

}  // namespace draftfeed
