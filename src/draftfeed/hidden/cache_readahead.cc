#include "draftfeed/hidden/cache_readahead.h"

#include <algorithm>

#include "draftfeed/common/file_readahead.h"

namespace draftfeed {

CacheReadahead::CacheReadahead(CacheReadaheadOptions options) : options_(options) {
  const int threads = std::max(1, options_.threads);
  threads_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

CacheReadahead::~CacheReadahead() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void CacheReadahead::add(std::vector<std::pair<std::int64_t, std::string>> files) {
  {
    std::lock_guard lock(mutex_);
    for (auto& file : files) queue_.push_back(std::move(file));
  }
  changed_.notify_all();
}

void CacheReadahead::reached(std::int64_t row) {
  {
    std::lock_guard lock(mutex_);
    const auto it = ahead_.find(row);
    if (it != ahead_.end()) {
      ahead_bytes_ -= it->second;
      ahead_.erase(it);
    } else {
      reached_early_.insert(row);
    }
  }
  changed_.notify_all();
}

void CacheReadahead::clear() {
  std::lock_guard lock(mutex_);
  queue_.clear();
  ahead_.clear();
  reached_early_.clear();
  ahead_bytes_ = 0;
  ++generation_;
}

CacheReadaheadStats CacheReadahead::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CacheReadahead::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] {
      return stopping_ || (!queue_.empty() && ahead_bytes_ < options_.max_ahead_bytes);
    });
    if (stopping_) return;
    auto [row, path] = std::move(queue_.front());
    queue_.pop_front();
    if (reached_early_.erase(row) != 0) {
      ++stats_.overtaken;
      continue;
    }
    const std::uint64_t generation = generation_;
    lock.unlock();
    const std::size_t bytes =
        options_.sequential_read
            ? read_file_into_page_cache(path, options_.chunk, options_.skip_cached, &stopping_)
            : readahead_file(path, options_.chunk, options_.skip_cached);
    lock.lock();
    if (generation != generation_) continue;  // cleared meanwhile: not counted
    if (reached_early_.erase(row) != 0) {
      ++stats_.overtaken;  // the fetch got there while we were reading: nothing is ahead
    } else if (bytes > 0) {
      ahead_[row] += bytes;
      ahead_bytes_ += bytes;
    }
    ++stats_.files;
    stats_.bytes += bytes;
    stats_.max_ahead = std::max<std::uint64_t>(stats_.max_ahead, ahead_bytes_);
  }
}

}  // namespace draftfeed
