// ThreadPool: tasks run by priority (lower first, equal ones in submission order), a task may
// submit more, shutdown either runs or drops what is queued but always lets a running task finish.
// The suite's name starts with Concurrent so CI runs it under ThreadSanitizer too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/thread_pool.h"
#include "test_gate.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

TEST(ConcurrentThreadPool, RunsLowerPriorityFirstThenInSubmissionOrder) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  TestGate latch;
  pool.submit(0, [&latch] { latch.pass(); });
  ASSERT_TRUE(latch.wait_arrived(1));  // the one worker is busy: everything below queues
  std::mutex mutex;
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    return [&, name] {
      std::lock_guard lock(mutex);
      order.push_back(name);
    };
  };
  pool.submit(5, record("5"));
  pool.submit(1, record("1a"));
  pool.submit(3, record("3"));
  pool.submit(1, record("1b"));
  latch.release();
  pool.shutdown(/*discard_pending=*/false);  // runs what is queued, then joins
  EXPECT_EQ(order, (std::vector<std::string>{"1a", "1b", "3", "5"}));
}

TEST(ConcurrentThreadPool, ATaskMaySubmitMore) {
  ThreadPool pool(2);
  std::mutex mutex;
  std::condition_variable done;
  int count = 0;
  std::function<void(int)> step = [&](int left) {
    {
      std::lock_guard lock(mutex);
      ++count;
    }
    done.notify_all();
    if (left > 0) pool.submit(left, [&step, left] { step(left - 1); });
  };
  pool.submit(0, [&step] { step(9); });
  {
    std::unique_lock lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, 10s, [&] { return count == 10; }));
  }
  pool.shutdown(false);  // the last task may still be returning: `step` must outlive it
}

// Opens the latch when the last task holding it is destroyed: when shutdown drops the queue.
struct OpensOnDrop {
  explicit OpensOnDrop(TestGate& latch) : latch(latch) {}
  ~OpensOnDrop() { latch.release(); }
  OpensOnDrop(const OpensOnDrop&) = delete;
  OpensOnDrop& operator=(const OpensOnDrop&) = delete;
  TestGate& latch;
};

TEST(ConcurrentThreadPool, ShutdownDiscardingDropsQueuedTasksButFinishesRunningOnes) {
  ThreadPool pool(1);
  TestGate latch;
  std::atomic<bool> running_finished{false};
  std::atomic<int> queued_ran{0};
  pool.submit(0, [&] {
    latch.pass();  // until the queued tasks are dropped (or the latch's bound, on a bug)
    running_finished = true;
  });
  ASSERT_TRUE(latch.wait_arrived(1));
  {
    auto opener = std::make_shared<OpensOnDrop>(latch);
    for (int i = 0; i < 5; ++i) pool.submit(1, [&queued_ran, opener] { ++queued_ran; });
  }
  pool.shutdown(/*discard_pending=*/true);  // drops the five, then waits for the running one
  EXPECT_TRUE(running_finished.load());
  EXPECT_EQ(queued_ran.load(), 0);
}

TEST(ConcurrentThreadPool, RunsTasksOnEveryThreadAtOnce) {
  // Three tasks that each wait for the others: they finish only if three threads run them.
  ThreadPool pool(3);
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  std::atomic<int> met{0};
  for (int i = 0; i < 3; ++i) {
    pool.submit(0, [&] {
      std::unique_lock lock(mutex);
      ++arrived;
      changed.notify_all();
      if (changed.wait_for(lock, 10s, [&] { return arrived == 3; })) ++met;
    });
  }
  pool.shutdown(false);
  EXPECT_EQ(met.load(), 3);
}

}  // namespace
}  // namespace draftfeed
