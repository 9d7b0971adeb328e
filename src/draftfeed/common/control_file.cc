#include "draftfeed/common/control_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>

namespace draftfeed {

namespace {

std::string join(const std::string& folder, const std::string& name) {
  if (folder.empty() || folder == ".") return name;
  if (folder.back() == '/') return folder + name;
  return folder + "/" + name;
}

// What a file that is not a regular file is, as the refusal names it.
const char* file_type_name(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

Error not_regular(const std::string& path, mode_t mode) {
  return Error(ErrorKind::kUnsupported,
               path + ": is " + file_type_name(mode) + ", not a regular file");
}

Error os_error(const std::string& what, const std::string& path, int err) {
  const ErrorKind kind = (err == ENOENT || err == ENOTDIR) ? ErrorKind::kNotFound : ErrorKind::kIo;
  return Error(kind, path + ": " + what + ": " + os_error_text(err));
}

std::int64_t modified_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// An open that failed: a link refused (ELOOP under O_NOFOLLOW), a socket (ENXIO), ... named by
// what the name is, where a stat of it can tell.
Error open_error(int folder, const std::string& name, const std::string& path, int err,
                 const ControlFileRules& rules) {
  struct stat st {};
  const int stat_flags = rules.links == ControlFileLinks::kRefuse ? AT_SYMLINK_NOFOLLOW : 0;
  const bool known = ::fstatat(folder, name.c_str(), &st, stat_flags) == 0;
  if (known && S_ISLNK(st.st_mode)) {
    return Error(ErrorKind::kInvalidArgument,
                 path + ": is a symbolic link; " + rules.what +
                     " is read from a regular file only, never through a link");
  }
  if (known && !S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  return os_error("cannot open", path, err);
}

// Reads `size` bytes at `offset` of `fd` into `out` (pread, retried on EINTR and short reads);
// the number read, fewer when the file ended first.
Result<std::size_t> read_exactly(int fd, std::uint64_t offset, char* out, std::size_t size,
                                 const std::string& path) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot read", path, errno);
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

Error size_changed(const std::string& path, std::uint64_t size, const std::string& then) {
  return Error(ErrorKind::kIo, path + ": changed while it was read (it had " +
                                   std::to_string(size) + " bytes when opened and " + then +
                                   "): is another process writing it? Read it again when it is "
                                   "done");
}

Result<ControlFile> read_open_file(int fd, const std::string& path, const ControlFileRules& rules) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return os_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > rules.max_bytes) {
    std::string shown = byte_count_text(size);
    if (size >= 1000) shown += " (" + std::to_string(size) + " bytes)";
    return Error(ErrorKind::kFormat, path + ": is " + shown + ", more than the " +
                                         byte_count_text(rules.max_bytes) + " " + rules.what +
                                         " may be");
  }
  ControlFile out;
  out.bytes.resize(static_cast<std::size_t>(size));
  auto got = read_exactly(fd, 0, out.bytes.data(), out.bytes.size(), path);
  if (!got.ok()) return got.error();
  if (got.value() < size) {
    return size_changed(path, size, "ended after " + std::to_string(got.value()));
  }
  char extra = 0;
  auto more = read_exactly(fd, size, &extra, 1, path);
  // A read past the size that finds a byte: the file grew. (A read error here is the OS's.)
  if (!more.ok()) return more.error();
  struct stat after {};
  if (::fstat(fd, &after) != 0) return os_error("cannot stat", path, errno);
  if (more.value() > 0) return size_changed(path, size, "held more when read");
  if (static_cast<std::uint64_t>(after.st_size) != size) {
    return size_changed(path, size,
                        std::to_string(static_cast<std::uint64_t>(after.st_size)) + " after");
  }
  out.identity = {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
  out.modified_ns = modified_ns(st);
  return out;
}

}  // namespace

Result<ControlFile> read_control_file_at(int folder, const std::string& folder_path,
                                         const std::string& name, const ControlFileRules& rules) {
  const std::string path = join(folder_path, name);
  if (rules.links == ControlFileLinks::kFollow) {
    // Opening a device can act on it (a tape rewinds): what the link names is looked at first,
    // and the descriptor opened is checked again below (the name may change in between).
    struct stat st {};
    if (::fstatat(folder, name.c_str(), &st, 0) == 0 && !S_ISREG(st.st_mode)) {
      return not_regular(path, st.st_mode);
    }
  }
  int flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  if (rules.links == ControlFileLinks::kRefuse) flags |= O_NOFOLLOW;
  const UniqueFd fd(::openat(folder, name.c_str(), flags));
  if (!fd) return open_error(folder, name, path, errno, rules);
  return read_open_file(fd.get(), path, rules);
}

Result<ControlFile> read_control_file(const std::string& path, const ControlFileRules& rules) {
  return read_control_file_at(AT_FDCWD, "", path, rules);
}

std::string byte_count_text(std::uint64_t bytes) {
  constexpr std::array<const char*, 4> kBinary = {"KiB", "MiB", "GiB", "TiB"};
  constexpr std::array<const char*, 5> kDecimal = {"KB", "MB", "GB", "TB", "PB"};
  // An exact multiple of a binary unit reads best in the largest unit that divides it.
  for (std::size_t u = kBinary.size(); u > 0; --u) {
    const std::uint64_t unit = std::uint64_t{1} << (10 * u);
    if (bytes >= unit && bytes % unit == 0)
      return std::to_string(bytes / unit) + " " + kBinary[u - 1];
  }
  if (bytes < 1000) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  double value = static_cast<double>(bytes) / 1000;
  std::size_t unit = 0;
  while (value >= 1000 && unit + 1 < kDecimal.size()) {
    value /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", value, kDecimal[unit]);
  return text;
}

}  // namespace draftfeed
