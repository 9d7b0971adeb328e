// The bytes a read-ahead holds ahead of its consumer (files read into the page cache, samples
// fetched and not yet claimed) against its limit, and the most it held: one account for both
// read-aheads, so their "held" and "peak" mean the same.
#pragma once

#include <algorithm>
#include <cstdint>

namespace draftfeed {

class ByteBudget {
 public:
  explicit ByteBudget(std::uint64_t limit = 0) : limit_(limit) {}

  std::uint64_t limit() const { return limit_; }
  void set_limit(std::uint64_t limit) { limit_ = limit; }
  std::uint64_t held() const { return held_; }
  std::uint64_t peak() const { return peak_; }

  // Whether `bytes` more stay within the limit; with `first_always_fits`, anything fits while
  // nothing is held (one item larger than the limit must still go through).
  bool fits(std::uint64_t bytes, bool first_always_fits = false) const {
    return (first_always_fits && held_ == 0) || held_ + bytes <= limit_;
  }
  void hold(std::uint64_t bytes) {
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  void release(std::uint64_t bytes) { held_ -= std::min(bytes, held_); }
  void clear() { held_ = 0; }

 private:
  std::uint64_t limit_;
  std::uint64_t held_ = 0;
  std::uint64_t peak_ = 0;
};

}  // namespace draftfeed
