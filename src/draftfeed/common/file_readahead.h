// Asking the kernel to read a file into the page cache ahead of its use, without waiting: the
// cold-read path of the cache (a terabyte cache is never in the page cache).
//
// posix_fadvise(POSIX_FADV_WILLNEED) starts asynchronous reads and returns, but Linux reads at most
// max(read_ahead_kb, the device's largest request) per call (128 KB by default on many disks), so
// the range is asked for in `chunk`-sized calls: the whole file is queued at once, and the device
// sees many large requests in flight instead of one synchronous page-fault read-around at a time.
// A file whose last byte is already in the page cache is taken as read (a file is read from its
// start, so its end is the last to arrive and the first to go) and skipped when `skip_cached`:
// asking again for resident pages costs a system call per chunk, 7% of a warm epoch's CPU
// (measured). A hint only: a missing or unreadable file, or a file system that ignores it, is not
// an error. Thread safety: any number of threads.
#pragma once

#include <cstddef>
#include <string>

namespace draftfeed {

inline constexpr std::size_t kReadaheadChunk = std::size_t{512} << 10;

// Queues reads of the whole file at `path`; returns the bytes asked for (0 if it cannot be opened,
// or if it is cached and `skip_cached`).
std::size_t readahead_file(const std::string& path, std::size_t chunk = kReadaheadChunk,
                           bool skip_cached = true);

}  // namespace draftfeed
