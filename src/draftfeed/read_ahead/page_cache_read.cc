#include "draftfeed/read_ahead/page_cache_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace draftfeed {

namespace {

// True when the first and the last page of the `size`-byte file open as `fd` are in the page
// cache: a file is read from its start, so its end is the last page to arrive, and the page cache
// drops the least recently used pages first, so its start is the first to go. Asked with mincore
// on a mapping, which starts no I/O. (A read that must not wait, preadv2 with RWF_NOWAIT, used
// before, starts the kernel's readahead for the page it misses; on a fast device that read
// completed before the call looked again, and a file with only its last page read was taken as
// cached: seen in CI.) Two pages, not all: mincore over a whole file walks its page cache, 21 us a
// MiB here, a sixth of the time the batch copy takes for that MiB.
bool file_cached(int fd, std::size_t size) {
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return false;
  const bool cached = mapped_file_cached(map, size);
  ::munmap(map, size);
  return cached;
}

// The size of the regular file open as `fd`, or -1 when it is not one or is skipped as cached.
off_t size_to_read(int fd, bool skip_cached) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  if (skip_cached && st.st_size > 0 && file_cached(fd, static_cast<std::size_t>(st.st_size))) {
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

// O_NONBLOCK: a FIFO (or device) under a cache file's name must not block the open; it is then
// skipped as not a regular file.
constexpr int kReadFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;

std::size_t readahead_file(const std::string& path, std::size_t chunk, bool skip_cached) {
  const int fd = ::open(path.c_str(), kReadFlags);
  if (fd < 0) return 0;
  const off_t size = size_to_read(fd, skip_cached);
  const std::size_t asked = size < 0 ? 0 : advise(fd, 0, static_cast<std::size_t>(size), chunk);
  ::close(fd);
  return asked;
}

std::size_t read_file_into_page_cache(const std::string& path, std::size_t chunk, bool skip_cached,
                                      const std::atomic<bool>* stop) {
  const int fd = ::open(path.c_str(), kReadFlags);
  if (fd < 0) return 0;
  const off_t size = size_to_read(fd, skip_cached);
  const std::size_t done =
      size > 0 ? read_open_file_into_page_cache(fd, static_cast<std::size_t>(size), chunk, stop)
               : 0;
  ::close(fd);
  return done;
}

namespace {

// Reads bytes [begin, end) of `fd` through sendfile to /dev/null, returning how far it got from
// `begin`; falls back to WILLNEED requests (`chunk`) where the file system has no sendfile.
std::size_t send_to_null(int fd, std::size_t begin, std::size_t end, std::size_t chunk,
                         const std::atomic<bool>* stop) {
  const int sink = null_sink();
  auto offset = static_cast<off_t>(begin);
  const auto last = static_cast<off_t>(end);
  while (offset < last && (stop == nullptr || !stop->load(std::memory_order_relaxed))) {
    const std::size_t step = std::min(kReadStep, static_cast<std::size_t>(last - offset));
    const ssize_t n = sink < 0 ? -1 : ::sendfile(sink, fd, &offset, step);
    if (n > 0) continue;  // sendfile moved `offset` on
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && offset == static_cast<off_t>(begin)) {
      // No sendfile from this file system (or no /dev/null): ask for the pages instead.
      offset = static_cast<off_t>(begin + advise(fd, begin, end, chunk));
    }
    break;  // an error, or the file shrank meanwhile: what was read stays read
  }
  return static_cast<std::size_t>(offset) - begin;
}

}  // namespace

std::size_t read_open_file_into_page_cache(int fd, std::size_t size, std::size_t chunk,
                                           const std::atomic<bool>* stop) {
  if (size == 0) return 0;
  // The kernel's readahead for this file may grow to twice the device's window.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return send_to_null(fd, 0, size, chunk, stop);
}

std::size_t read_open_file_range_into_page_cache(int fd, std::size_t begin, std::size_t end,
                                                 std::size_t chunk, const std::atomic<bool>* stop) {
  if (end <= begin) return 0;
  // The range's pages asked for exactly (WILLNEED reads no further), all at once, then waited for
  // by the read: its pages found in the page cache or under way, the kernel's readahead does not
  // run past the range into the file's other samples (its window, up to twice the device's, can
  // be megabytes).
  advise(fd, begin, end, chunk);
  return send_to_null(fd, begin, end, chunk, stop);
}

bool mapped_file_cached(const void* data, std::size_t size) {
  if (data == nullptr || size == 0) return true;
  static const auto kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto* base = static_cast<char*>(const_cast<void*>(data));
  const auto resident = [&](std::size_t offset) {
    unsigned char page = 0;
    return ::mincore(base + offset, 1, &page) == 0 && (page & 1) != 0;
  };
  return resident(0) && resident((size - 1) / kPage * kPage);
}

}  // namespace draftfeed
