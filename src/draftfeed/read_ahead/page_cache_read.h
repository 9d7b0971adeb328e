// Getting a file into the page cache ahead of its use: the cold-read path of the cache (a terabyte
// cache is never in the page cache).
//
// readahead_file does not wait: posix_fadvise(POSIX_FADV_WILLNEED) starts asynchronous reads and
// returns, but Linux reads at most max(read_ahead_kb, the device's largest request) per call (128
// KB by default on many disks), so the range is asked for in `chunk`-sized calls: the whole file is
// queued at once, and the device sees many large requests in flight instead of one synchronous
// page-fault read-around at a time. read_file_into_page_cache reads the file instead, without
// copying it anywhere: each call blocks until its file is in the page cache, so a caller wanting
// depth runs several at once. WILLNEED fills the page cache with single pages, so each device
// request carries at most max_segments pages, where a sequential read's kernel readahead allocates
// large folios and asks for them in large requests: reading is what the disk bound does, so it is
// the default (read_ahead/file_read_ahead.h; docs/decisions.md has the measurement).
//
// A file whose first and last pages are in the page cache (asked with mincore, which starts no
// I/O) is taken as read and skipped when `skip_cached`: a file is read from its start, so its end
// is the last page to arrive, and its start the first the page cache drops. Asking again for
// resident pages would cost a system call per chunk, a share of a warm epoch's CPU. A hint only: a
// missing or unreadable file, or a file system that ignores it, is not an error. Thread safety: any
// number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

namespace draftfeed {

inline constexpr std::size_t kReadaheadChunk = std::size_t{512} << 10;

// Queues reads of the whole file at `path`; returns the bytes asked for (0 if it cannot be opened,
// or if it is cached and `skip_cached`).
std::size_t readahead_file(const std::string& path, std::size_t chunk = kReadaheadChunk,
                           bool skip_cached = true);

// Reads the whole file at `path` into the page cache through the kernel's sequential readahead
// (sendfile to /dev/null: no copy to user space), returning once it is there; returns the bytes
// read (0 if it cannot be opened, or if it is cached and `skip_cached`). Where the file system
// cannot be read that way, falls back to readahead_file's requests (`chunk`), which return at once.
// Reads go in steps of kReadStep; once `stop` (if given) is set, no further step starts, so a
// reader being shut down waits for one step, not for a whole file on a slow disk.
inline constexpr std::size_t kReadStep = std::size_t{8} << 20;
std::size_t read_file_into_page_cache(const std::string& path, std::size_t chunk = kReadaheadChunk,
                                      bool skip_cached = true,
                                      const std::atomic<bool>* stop = nullptr);

// The same for a file already open as `fd` and `size` bytes long (its size when opened): no open,
// no stat (on a network file system each is a round trip). Does not close `fd`.
std::size_t read_open_file_into_page_cache(int fd, std::size_t size,
                                           std::size_t chunk = kReadaheadChunk,
                                           const std::atomic<bool>* stop = nullptr);

// The same for bytes [begin, end) of the open file `fd` only (a sample's range in a packed cache's
// shard), asked for exactly (WILLNEED) and then waited for (no readahead past `end`): returns the
// bytes read from `begin` on.
std::size_t read_open_file_range_into_page_cache(int fd, std::size_t begin, std::size_t end,
                                                 std::size_t chunk = kReadaheadChunk,
                                                 const std::atomic<bool>* stop = nullptr);

// Whether the first and the last page of the `size` bytes mapped at `data` are in the page cache
// (mincore: no I/O started): the test read_file_into_page_cache's `skip_cached` makes.
bool mapped_file_cached(const void* data, std::size_t size);

}  // namespace draftfeed
