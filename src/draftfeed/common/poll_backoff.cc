#include "draftfeed/common/poll_backoff.h"

#include <algorithm>
#include <thread>

namespace draftfeed {

PollBackoff::PollBackoff(Seconds timeout, Seconds max_interval)
    : deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout)),
      interval_(std::min(max_interval, std::max(Seconds(0.001), max_interval / 64))),
      max_interval_(max_interval) {}

bool PollBackoff::wait() {
  const Clock::time_point now = Clock::now();
  if (now >= deadline_) return false;
  const auto sleep = std::min<Clock::duration>(
      std::chrono::duration_cast<Clock::duration>(interval_), deadline_ - now);
  std::this_thread::sleep_for(sleep);
  ++waits_;
  interval_ = std::min(max_interval_, interval_ * 2);
  return true;
}

}  // namespace draftfeed
