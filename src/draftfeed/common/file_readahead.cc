#include "draftfeed/common/file_readahead.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>

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

}  // namespace

std::size_t readahead_file(const std::string& path, std::size_t chunk, bool skip_cached) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  std::size_t asked = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      !(skip_cached && st.st_size > 0 &&
        byte_cached(fd, static_cast<std::size_t>(st.st_size) - 1))) {
    const auto size = static_cast<std::size_t>(st.st_size);
    chunk = std::max<std::size_t>(chunk, 4096);
    for (std::size_t offset = 0; offset < size; offset += chunk) {
      const std::size_t length = std::min(chunk, size - offset);
      if (::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length),
                          POSIX_FADV_WILLNEED) != 0) {
        break;
      }
      asked += length;
    }
  }
  ::close(fd);
  return asked;
}

}  // namespace draftfeed
