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

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open", path, errno);
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
  }
  // The mapping keeps the file's pages; the descriptor is no longer needed.
  ::close(fd);
  const Identity identity{static_cast<std::uint64_t>(st.st_dev),
                          static_cast<std::uint64_t>(st.st_ino), modified_ns(st)};
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size, identity));
}

std::shared_ptr<const MappedFile> MappedFile::open_or_throw(const std::string& path) {
  return open(path).value();
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

void MappedFile::prefetch(std::size_t offset, std::size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t start = offset / page * page;
  const std::size_t end = std::min(size_, offset + length);
  ::madvise(const_cast<std::uint8_t*>(data_) + start, end - start, MADV_WILLNEED);
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
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return std::nullopt;  // deleted: the mapped file lives on
  if (static_cast<std::uint64_t>(st.st_dev) != identity_.device ||
      static_cast<std::uint64_t>(st.st_ino) != identity_.inode) {
    return std::nullopt;  // replaced by another file: the mapped one lives on, unchanged
  }
  if (static_cast<std::size_t>(st.st_size) != size_) {
    return "changed size from " + std::to_string(size_) + " to " + std::to_string(st.st_size) +
           " bytes while being read";
  }
  if (modified_ns(st) != identity_.modified_ns) return std::string("was modified while being read");
  return std::nullopt;
}

}  // namespace draftfeed
