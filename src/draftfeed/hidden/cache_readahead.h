// Reading the cache ahead of the batch copy, in the order the plan will read it: what keeps a cold
// cache (a terabyte is never in the page cache) at the disk's speed.
//
// The pipeline tells the cache source which rows come next (SampleSource::will_need, as it takes
// each batch on); their files go into a queue here. `threads` threads take the files in queue order
// and read each whole file into the page cache (file_readahead.h: by default sequential reads,
// which the kernel serves in large requests; two at a time keep a few in flight, as the disk bound
// of bench_cold.py does), staying at most `max_ahead_bytes` ahead of the fetches: deep enough to
// keep the device busy while batches are copied, shallow enough that the batch the copy needs next
// is not queued behind later ones (measured: queueing four batches at once delays the first by the
// whole queue). A fetch that gets to its row first says so (`reached`), and that row is skipped or
// counted as consumed.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace draftfeed {

struct CacheReadaheadOptions {
  std::size_t max_ahead_bytes = std::size_t{256} << 20;
  std::size_t chunk = std::size_t{512} << 10;  // bytes per readahead request (file_readahead.h)
  bool skip_cached = true;                     // files already in the page cache are not asked for
  // Read each file (read_file_into_page_cache), or only ask for it (readahead_file: returns at
  // once, single-page requests; 0.5x the disk bound on a virtio disk, measured).
  bool sequential_read = true;
  // Files read at once (at least 1). Each thread starts a file while the bytes ahead are under
  // max_ahead_bytes, so up to `threads` files may go beyond it.
  int threads = 2;
};

struct CacheReadaheadStats {
  std::int64_t files = 0;       // files read ahead
  std::uint64_t bytes = 0;      // their bytes
  std::int64_t overtaken = 0;   // rows a fetch reached before their readahead (skipped)
  std::uint64_t max_ahead = 0;  // the most bytes ahead of the fetches at any time
};

class CacheReadahead {
 public:
  explicit CacheReadahead(CacheReadaheadOptions options = {});
  ~CacheReadahead();  // stops the threads (queued files are dropped)
  CacheReadahead(const CacheReadahead&) = delete;
  CacheReadahead& operator=(const CacheReadahead&) = delete;

  // Queues rows' files, in the order the fetches will reach them.
  void add(std::vector<std::pair<std::int64_t, std::string>> files);
  // A fetch is reading `row` now.
  void reached(std::int64_t row);
  // Drops the queue and the accounting (an epoch stopped; the next one starts afresh).
  void clear();

  CacheReadaheadStats stats() const;

 private:
  void run();

  const CacheReadaheadOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::int64_t, std::string>> queue_;
  std::unordered_map<std::int64_t, std::uint64_t> ahead_;  // read ahead, not reached: row -> bytes
  std::unordered_set<std::int64_t> reached_early_;         // reached before their readahead
  std::uint64_t ahead_bytes_ = 0;
  std::uint64_t generation_ = 0;        // bumped by clear(): a readahead in progress is not counted
  std::atomic<bool> stopping_ = false;  // also read without the lock, by a file being read
  CacheReadaheadStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace draftfeed
