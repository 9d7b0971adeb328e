#include "draftfeed/common/thread_pool.h"

#include <algorithm>

namespace draftfeed {

ThreadPool::ThreadPool(int num_threads) {
  const int count = std::max(1, num_threads);
  threads_.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) threads_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() { shutdown(false); }

void ThreadPool::submit(std::int64_t priority, Task task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push(Entry{priority, next_order_++, std::move(task)});
  }
  wake_.notify_one();
}

void ThreadPool::shutdown(bool discard_pending) {
  {
    std::lock_guard lock(mutex_);
    if (discard_pending) queue_ = {};
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void ThreadPool::work() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left to run
      // priority_queue::top is const; the task is moved out just before pop.
      task = std::move(const_cast<Entry&>(queue_.top()).task);
      queue_.pop();
    }
    task();
  }
}

}  // namespace draftfeed
