// A fixed set of worker threads running prioritised tasks.
//
// The pipeline gives every task the sequence number of the batch it serves as its priority (lower
// runs first), so workers finish the oldest batch before starting on newer ones: in-order delivery
// waits as little as possible while later batches still fill idle threads. Thread safety: `submit`
// may be called from any thread, including from inside a task.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace draftfeed {

class ThreadPool {
 public:
  using Task = std::function<void()>;

  explicit ThreadPool(int num_threads);
  // Stops the workers after the tasks already queued have run (see `shutdown`).
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; lower `priority` runs first, equal priorities in submission order. A task must
  // not throw: exceptions are the caller's to catch and carry (the pipeline stores them per batch).
  void submit(std::int64_t priority, Task task);

  // Drops the tasks not yet started when `discard_pending`, waits for running ones, joins the
  // threads.
  void shutdown(bool discard_pending);

  int size() const { return static_cast<int>(threads_.size()); }

 private:
  struct Entry {
    std::int64_t priority;
    std::uint64_t order;
    Task task;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.priority != b.priority ? a.priority > b.priority : a.order > b.order;
    }
  };

  void work();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::priority_queue<Entry, std::vector<Entry>, Later> queue_;
  std::uint64_t next_order_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace draftfeed
