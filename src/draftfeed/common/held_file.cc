#include "draftfeed/common/held_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <vector>

namespace draftfeed {

namespace {

// Deeper than any real folder tree: a walk up that has not reached `/` by then gives up.
constexpr int kMaxFolderDepth = 4096;

Error os_error(const std::string& what, const std::string& path, int err) {
  const ErrorKind kind = (err == ENOENT || err == ENOTDIR) ? ErrorKind::kNotFound : ErrorKind::kIo;
  return Error(kind, path + ": " + what + ": " + os_error_text(err));
}

std::string join(const std::string& folder, const std::string& name) {
  if (folder == ".") return name;
  if (!folder.empty() && folder.back() == '/') return folder + name;
  return folder + "/" + name;
}

std::optional<FileIdentity> identity_at(int folder, const std::string& name) {
  struct stat st {};
  if (::fstatat(folder, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISLNK(st.st_mode)) {
    return std::nullopt;
  }
  return FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

// rename(2) refusing to replace: the name moved to must be free (a name of this process's).
int rename_no_replace(int from_folder, const std::string& from, int to_folder,
                      const std::string& to) {
  const int done = ::renameat2(from_folder, from.c_str(), to_folder, to.c_str(), RENAME_NOREPLACE);
  if (done == 0 || (errno != EINVAL && errno != ENOSYS)) return done;
  // A file system without RENAME_NOREPLACE (some network ones): `to` is a fresh name unique to
  // this process, so a plain rename replaces nothing either.
  return ::renameat(from_folder, from.c_str(), to_folder, to.c_str());
}

std::optional<Error> copy_descriptor(int in, int out, const std::string& source,
                                     const std::string& target) {
  std::vector<char> buffer(std::size_t{4} << 20);
  off_t offset = 0;
  while (true) {
    const ssize_t got = ::pread(in, buffer.data(), buffer.size(), offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot read", source, errno);
    }
    if (got == 0) return std::nullopt;
    offset += got;
    for (ssize_t done = 0; done < got;) {
      const ssize_t put = ::write(out, buffer.data() + done, static_cast<std::size_t>(got - done));
      if (put < 0) {
        if (errno == EINTR) continue;
        return os_error("cannot write", target, errno);
      }
      done += put;
    }
  }
}

std::atomic<std::uint64_t> name_counter{0};

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<PlainPath> split_plain_path(std::string_view path) {
  const std::string shown(path.substr(0, std::min<std::size_t>(path.size(), 4096)));
  auto refuse = [&](const std::string& why) -> Result<PlainPath> {
    return Error(ErrorKind::kInvalidArgument,
                 "'" + shown + "' is not a plain path to a file: " + why);
  };
  if (path.empty()) return refuse("it is empty");
  if (path.find('\0') != std::string_view::npos) return refuse("it holds a NUL byte");
  if (path.back() == '/') return refuse("it ends with '/'");
  const std::size_t first = path.front() == '/' ? 1 : 0;
  for (std::size_t begin = first; begin <= path.size();) {
    std::size_t end = path.find('/', begin);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(begin, end - begin);
    if (part.empty()) return refuse("it has an empty component ('//')");
    if (part == "." || part == "..")
      return refuse("it has a '" + std::string(part) + "' component");
    begin = end + 1;
  }
  const std::size_t slash = path.rfind('/');
  PlainPath out;
  if (slash == std::string_view::npos) {
    out.folder = ".";
    out.name = std::string(path);
  } else {
    out.folder = slash == 0 ? std::string("/") : std::string(path.substr(0, slash));
    out.name = std::string(path.substr(slash + 1));
  }
  return out;
}

Result<UniqueFd> open_folder(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return os_error("cannot open the folder", path, errno);
  return fd;
}

Result<FileIdentity> identity_of(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return os_error("cannot stat", what, errno);
  return FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

bool folder_within(int folder, const FileIdentity& ancestor) {
  // O_PATH: walking up needs only the right to search each folder, not to list it.
  UniqueFd current(::openat(folder, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  for (int depth = 0; current && depth < kMaxFolderDepth; ++depth) {
    struct stat here {};
    if (::fstat(current.get(), &here) != 0) return false;
    const FileIdentity id{static_cast<std::uint64_t>(here.st_dev),
                          static_cast<std::uint64_t>(here.st_ino)};
    if (id == ancestor) return true;
    UniqueFd parent(::openat(current.get(), "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!parent) return false;
    struct stat up {};
    if (::fstat(parent.get(), &up) != 0) return false;
    if (up.st_dev == here.st_dev && up.st_ino == here.st_ino) return false;  // `/`
    current = std::move(parent);
  }
  return false;
}

bool is_cache_file_name(std::string_view name) {
  return name.starts_with("hs_") || name.starts_with(".hs_");
}

bool folder_holds_cache_files(int folder, std::string_view except) {
  const int listing = ::openat(folder, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (listing < 0) return false;
  DIR* dir = ::fdopendir(listing);
  if (dir == nullptr) {
    ::close(listing);
    return false;
  }
  bool found = false;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name(entry->d_name);
    if (name != except && is_cache_file_name(name)) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

Result<HeldFile> HeldFile::open(UniqueFd folder, std::string folder_path, std::string name,
                                bool follow_link) {
  HeldFile out;
  out.path_ = join(folder_path, name);
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  UniqueFd file(::openat(folder.get(), name.c_str(), flags | O_NOFOLLOW));
  if (!file && errno == ELOOP) {
    if (!follow_link) return Error(ErrorKind::kInvalidArgument, out.path_ + ": is a symbolic link");
    out.is_link_ = true;
    file.reset(::openat(folder.get(), name.c_str(), flags));
  }
  if (!file) return os_error("cannot open", out.path_, errno);
  struct statx stx {};
  if (::statx(file.get(), "", AT_EMPTY_PATH,
              STATX_TYPE | STATX_INO | STATX_SIZE | STATX_NLINK | STATX_CTIME | STATX_BTIME,
              &stx) != 0) {
    return os_error("cannot stat", out.path_, errno);
  }
  if (!S_ISREG(stx.stx_mode)) {
    return Error(
        ErrorKind::kUnsupported,
        out.path_ + ": is not a regular file (a folder, FIFO, socket or device is never read)");
  }
  // Reads of a regular file never block anyway; the flag only mattered for the open.
  const int status = ::fcntl(file.get(), F_GETFL);
  if (status >= 0) ::fcntl(file.get(), F_SETFL, status & ~O_NONBLOCK);
  // fstat's st_dev, as every other check compares (statx splits the device number).
  auto id = identity_of(file.get(), out.path_);
  if (!id.ok()) return id.error();
  out.identity_ = id.value();
  out.size_ = stx.stx_size;
  out.links_ = stx.stx_nlink;
  out.created_is_birth_ = (stx.stx_mask & STATX_BTIME) != 0;
  const statx_timestamp& created = out.created_is_birth_ ? stx.stx_btime : stx.stx_ctime;
  out.created_ns_ = static_cast<std::int64_t>(created.tv_sec) * 1'000'000'000 + created.tv_nsec;
  out.folder_ = std::move(folder);
  out.file_ = std::move(file);
  out.folder_path_ = std::move(folder_path);
  out.name_ = std::move(name);
  return out;
}

bool HeldFile::still_named() const {
  const auto now = identity_at(folder_.get(), name_);
  return now && *now == identity_;
}

std::optional<Error> HeldFile::checked_unlink_aside() const {
  // Renamed aside first: what is then checked and unlinked is what the rename took, under a name
  // only this process uses, so nothing put at the old name meanwhile is ever removed.
  const std::string aside = process_unique_name("." + name_, "remove");
  if (rename_no_replace(folder_.get(), name_, folder_.get(), aside) != 0) {
    if (errno == ENOENT) return std::nullopt;  // already gone
    return os_error("cannot remove", path_, errno);
  }
  const auto taken = identity_at(folder_.get(), aside);
  if (!taken || *taken != identity_) {
    // Another file took the name meanwhile: put it back, untouched.
    if (rename_no_replace(folder_.get(), aside, folder_.get(), name_) != 0) {
      return Error(ErrorKind::kInvalidArgument,
                   path_ +
                       ": replaced since it was read; the other file could not be put back "
                       "and stays as " +
                       join(folder_path_, aside));
    }
    return Error(ErrorKind::kInvalidArgument,
                 path_ + ": replaced since it was read: left in place");
  }
  if (::unlinkat(folder_.get(), aside.c_str(), 0) != 0 && errno != ENOENT) {
    return os_error("cannot remove", join(folder_path_, aside), errno);
  }
  return std::nullopt;
}

std::optional<Error> HeldFile::remove() const {
  if (is_link_)
    return Error(ErrorKind::kInvalidArgument, path_ + ": a symbolic link is never removed");
  const auto now = identity_at(folder_.get(), name_);
  if (!now) {
    struct stat st {};
    if (::fstatat(folder_.get(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
      return std::nullopt;  // already gone
    }
    return Error(ErrorKind::kInvalidArgument,
                 path_ + ": replaced since it was read: left in place");
  }
  if (*now != identity_) {
    return Error(ErrorKind::kInvalidArgument,
                 path_ + ": replaced since it was read: left in place");
  }
  return checked_unlink_aside();
}

std::optional<Error> HeldFile::move_to(int target_folder, const std::string& target_path,
                                       const std::string& target_name, const std::string& temporary,
                                       bool copy) const {
  if (is_link_)
    return Error(ErrorKind::kInvalidArgument, path_ + ": a symbolic link is never moved");
  if (!still_named()) {
    return Error(ErrorKind::kInvalidArgument,
                 path_ + ": replaced since it was read: left in place");
  }
  const std::string target = join(target_path, target_name);
  const std::string temp_path = join(target_path, temporary);
  if (!copy && rename_no_replace(folder_.get(), name_, target_folder, temporary) == 0) {
    const auto taken = identity_at(target_folder, temporary);
    if (!taken || *taken != identity_) {
      // Not the file read: back where it was, untouched.
      if (rename_no_replace(target_folder, temporary, folder_.get(), name_) != 0) {
        return Error(ErrorKind::kInvalidArgument,
                     path_ +
                         ": replaced since it was read; the other file could not be put back "
                         "and stays as " +
                         temp_path);
      }
      return Error(ErrorKind::kInvalidArgument,
                   path_ + ": replaced since it was read: left in place");
    }
    if (::renameat(target_folder, temporary.c_str(), target_folder, target_name.c_str()) != 0) {
      const int err = errno;
      (void)rename_no_replace(target_folder, temporary, folder_.get(), name_);
      return os_error("cannot move " + path_ + " to", target, err);
    }
    return std::nullopt;
  }
  if (!copy && errno != EXDEV) return os_error("cannot move " + path_ + " to", target, errno);
  // Across file systems: the bytes come from the descriptor checked, never from the name.
  UniqueFd out(::openat(target_folder, temporary.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!out) return os_error("cannot create", temp_path, errno);
  auto fail = [&](const Error& error) -> std::optional<Error> {
    out.reset();
    ::unlinkat(target_folder, temporary.c_str(), 0);
    return Error(error.kind(), "cannot copy " + path_ + " into " + target + ": " + error.what() +
                                   " (nothing was written under " + target + ")");
  };
  if (auto error = copy_descriptor(file_.get(), out.get(), path_, temp_path)) return fail(*error);
  if (::fsync(out.get()) != 0) return fail(os_error("cannot fsync", temp_path, errno));
  if (::close(out.release()) != 0) return fail(os_error("cannot close", temp_path, errno));
  if (::renameat(target_folder, temporary.c_str(), target_folder, target_name.c_str()) != 0) {
    return fail(os_error("cannot move " + temp_path + " to", target, errno));
  }
  fsync_folder_fd(target_folder);
  if (auto error = remove()) {
    return Error(error->kind(),
                 "copied into " + target + " but the source stays: " + error->what());
  }
  return std::nullopt;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string process_unique_name(const std::string& prefix, const std::string& tag) {
  return prefix + "." + tag + "-" + host_name() + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(name_counter.fetch_add(1));
}

void fsync_folder_fd(int folder) {
  // Some file systems refuse fsync on a folder (EINVAL); the rename is then as durable as they
  // allow.
  (void)::fsync(folder);
}

}  // namespace draftfeed
