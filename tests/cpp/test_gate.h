// A gate for tests that hold work in flight (a request, a task) while they act: `pass()` counts
// the arrival and waits until the gate opens (bounded, so a failing test ends); the test waits for
// arrivals with `wait_arrived(n)` and opens with `release()`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace draftfeed {

class TestGate {
 public:
  void pass() {
    std::unique_lock lock(mutex_);
    ++arrived_;
    changed_.notify_all();
    changed_.wait_for(lock, std::chrono::seconds(30), [this] { return open_; });
  }
  bool wait_arrived(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_ >= n; });
  }
  void release() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  bool open_ = false;
};

}  // namespace draftfeed
