#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "draftfeed/common/run_workers.h"

namespace draftfeed {
namespace {

TEST(RunWorkersTest, EveryIndexRunsOnceAndTheCallerIsIndexZero) {
  std::vector<std::atomic<int>> runs(4);
  std::thread::id zero;
  run_workers(4, [&](unsigned index, const std::atomic<bool>&) {
    ++runs[index];
    if (index == 0) zero = std::this_thread::get_id();
  });
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
  EXPECT_EQ(zero, std::this_thread::get_id());
}

TEST(RunWorkersTest, ZeroThreadsRunsTheCallerOnly) {
  int runs = 0;
  run_workers(0, [&](unsigned, const std::atomic<bool>&) { ++runs; });
  EXPECT_EQ(runs, 1);
}

TEST(RunWorkersTest, TheFirstExceptionStopsTheOthersAndIsRethrownAfterTheJoin) {
  // Worker 1 throws; the others loop until told to stop (a hang here would be the bug), and every
  // one of them has returned before the exception reaches the caller.
  std::atomic<int> returned{0};
  auto work = [&](unsigned index, const std::atomic<bool>& stop) {
    if (index == 1) {
      ++returned;
      throw std::runtime_error("worker 1 failed");
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!stop && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    EXPECT_TRUE(stop.load());
    ++returned;
  };
  try {
    run_workers(3, work);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 1 failed");
  }
  EXPECT_EQ(returned.load(), 3);
}

}  // namespace
}  // namespace draftfeed
