#include "draftfeed/common/file_readahead.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace draftfeed {

namespace {

// True when the byte at `offset` is in the page cache: a read that must not wait for the device
// (RWF_NOWAIT) succeeds. A kernel without RWF_NOWAIT for buffered reads says no.
bool byte_cached(int fd, std::size_t offset) {
  char byte;
  struct iovec io {
    &byte, 1
  };
  return ::preadv2(fd, &io, 1, static_cast<off_t>(offset), RWF_NOWAIT) == 1;
}

// The size of the regular file open as `fd`, or -1 when it is not one or is skipped as cached.
off_t size_to_read(int fd, bool skip_cached) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  if (skip_cached && st.st_size > 0 && byte_cached(fd, static_cast<std::size_t>(st.st_size) - 1)) {
    return -1;
  }
  return st.st_size;
}

// WILLNEED requests for [offset, size) in `chunk`-sized calls; returns the bytes asked for.
std::size_t advise(int fd, std::size_t offset, std::size_t size, std::size_t chunk) {
  chunk = std::max<std::size_t>(chunk, 4096);
  std::size_t asked = 0;
  for (; offset < size; offset += chunk) {
    const std::size_t length = std::min(chunk, size - offset);
    if (::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length),
                        POSIX_FADV_WILLNEED) != 0) {
      break;
    }
    asked += length;
  }
  return asked;
}

// /dev/null, opened once for the process (sendfile's sink: its pages are dropped, not copied).
int null_sink() {
  static const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  return fd;
}

}  // namespace

std::size_t readahead_file(const std::string& path, std::size_t chunk, bool skip_cached) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const off_t size = size_to_read(fd, skip_cached);
  const std::size_t asked = size < 0 ? 0 : advise(fd, 0, static_cast<std::size_t>(size), chunk);
  ::close(fd);
  return asked;
}

std::size_t read_file_into_page_cache(const std::string& path, std::size_t chunk, bool skip_cached,
                                      const std::atomic<bool>* stop) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const off_t size = size_to_read(fd, skip_cached);
  std::size_t done = 0;
  if (size > 0) {
    // The kernel's readahead for this file may grow to twice the device's window.
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    const int sink = null_sink();
    off_t offset = 0;
    while (offset < size && (stop == nullptr || !stop->load(std::memory_order_relaxed))) {
      const std::size_t step = std::min(kReadStep, static_cast<std::size_t>(size - offset));
      const ssize_t n = sink < 0 ? -1 : ::sendfile(sink, fd, &offset, step);
      if (n > 0) continue;  // sendfile moved `offset` on
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && offset == 0) {
        // No sendfile from this file system (or no /dev/null): ask for the pages instead.
        offset = static_cast<off_t>(advise(fd, 0, static_cast<std::size_t>(size), chunk));
      }
      break;  // an error, or the file shrank meanwhile: what was read stays read
    }
    done = static_cast<std::size_t>(offset);
  }
  ::close(fd);
  return done;
}

}  // namespace draftfeed
