// What a read-ahead may hold ahead of its consumer, and what it reports of it. Both read-aheads
// (file_read_ahead.h: files read into the page cache and not yet fetched;
// source/lookahead_source.h: samples fetched and not yet claimed) keep one ByteBudget, take their
// limit from one rule (read_ahead_budget_bytes: the loader's one setting, read_ahead_bytes) and
// report one group, ReadAheadMemory, so that "held", "peak", "limit" and the hedges mean the same
// in both and the loader reports their sum once (docs/loader.md, "Read-ahead memory").
#pragma once

#include <algorithm>
#include <cstdint>

namespace draftfeed {

// The default budget: kReadAheadBatches of the loader's batch buffers' bytes (docs/decisions.md:
// why four), and at least kMinReadAheadBytes (a read-ahead of a few small batches would not keep a
// cold disk or a network file system busy).
inline constexpr std::uint64_t kReadAheadBatches = 4;
inline constexpr std::uint64_t kMinReadAheadBytes = std::uint64_t{256} << 20;

// The budget of a loader's read-ahead: `setting` when above 0 (the user's read_ahead_bytes), else
// the default rule above for a loader whose batch buffers hold `batch_memory_bytes` (0: not known
// yet, kMinReadAheadBytes).
constexpr std::uint64_t read_ahead_budget_bytes(std::uint64_t setting,
                                                std::uint64_t batch_memory_bytes) {
  if (setting > 0) return setting;
  return std::max(kReadAheadBatches * batch_memory_bytes, kMinReadAheadBytes);
}

// One read-ahead's memory and its hedges (second asks of something slow: an open, a request), as
// every report names them.
struct ReadAheadMemory {
  std::uint64_t held_bytes = 0;   // held ahead of the consumer now
  std::uint64_t peak_bytes = 0;   // the most held at once
  std::uint64_t limit_bytes = 0;  // the budget
  std::int64_t hedges = 0;        // second (or later) asks started
  std::int64_t hedges_won = 0;    // asked again, and a later ask answered first
  std::int64_t hedges_lost = 0;   // asked again, and the first ask answered first

  // Two read-aheads of one loader: their sum (a peak of the sum is at most the sum of the peaks).
  ReadAheadMemory& operator+=(const ReadAheadMemory& other) {
    held_bytes += other.held_bytes;
    peak_bytes += other.peak_bytes;
    limit_bytes += other.limit_bytes;
    hedges += other.hedges;
    hedges_won += other.hedges_won;
    hedges_lost += other.hedges_lost;
    return *this;
  }
};

// Each statistic under its reported name (common/stats_tree.h).
template <typename Visit>
constexpr void for_each_stat(const ReadAheadMemory& m, Visit&& visit) {
  visit("held_bytes", m.held_bytes);
  visit("peak_bytes", m.peak_bytes);
  visit("limit_bytes", m.limit_bytes);
  visit("hedges", m.hedges);
  visit("hedges_won", m.hedges_won);
  visit("hedges_lost", m.hedges_lost);
}

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

  // The held, peak and limit fields of `memory` (its hedges are the read-ahead's own).
  void report(ReadAheadMemory& memory) const {
    memory.held_bytes = held_;
    memory.peak_bytes = peak_;
    memory.limit_bytes = limit_;
  }

 private:
  std::uint64_t limit_;
  std::uint64_t held_ = 0;
  std::uint64_t peak_ = 0;
};

}  // namespace draftfeed
