#include "draftfeed/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

namespace draftfeed {

namespace {

Error os_error(const std::string& what, const std::string& path, int err) {
  const ErrorKind kind = (err == ENOENT || err == ENOTDIR) ? ErrorKind::kNotFound : ErrorKind::kIo;
  return Error(kind, path + ": " + what + ": " + os_error_text(err));
}

std::int64_t modified_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path,
                                                           MapOptions options) {
  // O_NONBLOCK: a FIFO (or a device) under a cache file's name must not block the open; it is then
  // refused as not a regular file. O_NOCTTY: a terminal named so never becomes ours.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return os_error("cannot open", path, errno);
  return map_descriptor(fd, path, options);
}

Result<std::shared_ptr<const MappedFile>> MappedFile::map_descriptor(int fd, std::string path,
                                                                     MapOptions options) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return os_error("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error(ErrorKind::kIo, path + ": not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  const std::uint8_t* data = nullptr;
  if (size > 0) {
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return os_error("cannot mmap", path, err);
    }
    data = static_cast<const std::uint8_t*>(addr);
    if (options.header_only) ::madvise(addr, size, MADV_RANDOM);
  }
  // The mapping keeps the file's pages; the descriptor is needed only to read ahead.
  if (!options.keep_descriptor) ::close(fd);
  const Identity identity{static_cast<std::uint64_t>(st.st_dev),
                          static_cast<std::uint64_t>(st.st_ino), modified_ns(st)};
  return std::shared_ptr<const MappedFile>(
      new MappedFile(std::move(path), data, size, identity, options.keep_descriptor ? fd : -1));
}

std::shared_ptr<const MappedFile> MappedFile::open_or_throw(const std::string& path) {
  return open(path).value();
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::size_t> MappedFile::read_at(std::size_t offset, std::size_t length,
                                        std::uint8_t* out) const {
  if (fd_ < 0) return Error(ErrorKind::kRuntime, path_ + ": read_at without a kept descriptor");
  std::size_t done = 0;
  while (done < length) {
    const ssize_t got = ::pread(fd_, out + done, length - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot read", path_, errno);
    }
    if (got == 0) break;  // end of file: it shrank
    done += static_cast<std::size_t>(got);
  }
  return done;
}

Result<std::size_t> MappedFile::read_at(std::size_t offset, std::span<iovec> parts) const {
  if (fd_ < 0) return Error(ErrorKind::kRuntime, path_ + ": read_at without a kept descriptor");
  std::size_t done = 0;
  while (!parts.empty()) {
    const ssize_t got = ::preadv(fd_, parts.data(), static_cast<int>(parts.size()),
                                 static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot read", path_, errno);
    }
    if (got == 0) break;  // end of file: it shrank
    done += static_cast<std::size_t>(got);
    // Skip the parts filled; the first one not filled starts where the read stopped.
    auto left = static_cast<std::size_t>(got);
    while (!parts.empty() && left >= parts.front().iov_len) {
      left -= parts.front().iov_len;
      parts = parts.subspan(1);
    }
    if (!parts.empty()) {
      parts.front().iov_base = static_cast<std::uint8_t*>(parts.front().iov_base) + left;
      parts.front().iov_len -= left;
    }
  }
  return done;
}

void MappedFile::advise_normal() const {
  if (data_ != nullptr) ::madvise(const_cast<std::uint8_t*>(data_), size_, MADV_NORMAL);
}

void MappedFile::release(std::size_t offset, std::size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages only: a page the range shares with its neighbours may still be read for them.
  const std::size_t start = (offset + page - 1) / page * page;
  const std::size_t end = std::min(size_, offset + length) / page * page;
  if (end <= start) return;
  ::madvise(const_cast<std::uint8_t*>(data_) + start, end - start, MADV_DONTNEED);
}

void MappedFile::release(const std::uint8_t* begin, const std::uint8_t* end) const {
  if (data_ == nullptr || begin < data_ || end > data_ + size_ || end <= begin) return;
  release(static_cast<std::size_t>(begin - data_), static_cast<std::size_t>(end - begin));
}

std::optional<std::string> MappedFile::change_since_mapped() const {
  std::uint64_t size = 0;
  std::int64_t modified = 0;
  if (fd_ >= 0) {
    // The mapped file itself, whatever its path names now; no round trip to a server.
    struct statx st {};
    if (::statx(fd_, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_SIZE | STATX_MTIME, &st) != 0) {
      return std::nullopt;
    }
    size = st.stx_size;
    modified =
        static_cast<std::int64_t>(st.stx_mtime.tv_sec) * 1'000'000'000 + st.stx_mtime.tv_nsec;
  } else {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) return std::nullopt;  // deleted: the mapped file lives on
    if (static_cast<std::uint64_t>(st.st_dev) != identity_.device ||
        static_cast<std::uint64_t>(st.st_ino) != identity_.inode) {
      return std::nullopt;  // replaced by another file: the mapped one lives on, unchanged
    }
    size = static_cast<std::uint64_t>(st.st_size);
    modified = modified_ns(st);
  }
  if (size != size_) {
    return "changed size from " + std::to_string(size_) + " to " + std::to_string(size) +
           " bytes while being read";
  }
  if (modified != identity_.modified_ns) return std::string("was modified while being read");
  return std::nullopt;
}

}  // namespace draftfeed
