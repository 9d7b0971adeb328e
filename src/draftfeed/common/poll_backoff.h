// Waiting for something nothing announces: a writer's flock on a network file system (NFS, Lustre,
// CephFS, FUSE mounts have no inotify, and flock cannot be waited for with a deadline), so the
// waiter asks again and again. Asking costs a round trip to the server there, so the interval
// between attempts grows: the first retries come soon (a writer that is about to finish is noticed
// within milliseconds), later ones at most `max_interval` apart (a long write costs a few attempts
// per second, not hundreds), and the last wait ends exactly at the deadline, so a timeout is
// reported on time.
//
//   PollBackoff backoff(timeout, max_interval);
//   while (!ready()) {
//     if (!backoff.wait()) return timed_out();
//   }
//
// Not thread-safe: one waiter per object.
#pragma once

#include <chrono>
#include <cstdint>

namespace draftfeed {

class PollBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  using Seconds = std::chrono::duration<double>;

  // The first interval is max_interval / 64 (at least 1 ms, at most max_interval); each next one
  // doubles, up to max_interval.
  PollBackoff(Seconds timeout, Seconds max_interval);

  // The interval the next wait() sleeps (before the deadline cuts it short).
  Seconds next_interval() const { return interval_; }
  // Sleeps the next interval, cut at the deadline; false when the deadline has passed (no sleep).
  bool wait();
  // How many times wait() slept.
  std::int64_t waits() const { return waits_; }

 private:
  Clock::time_point deadline_;
  Seconds interval_;
  Seconds max_interval_;
  std::int64_t waits_ = 0;
};

}  // namespace draftfeed
