// The waits between attempts at something nothing announces (a writer's lock on a network file
// system): short at first, doubling to a ceiling, the last one cut at the deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "draftfeed/common/poll_backoff.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;
using Seconds = PollBackoff::Seconds;

TEST(PollBackoffTest, IntervalsDoubleFromASixtyFourthOfTheCeilingToIt) {
  PollBackoff backoff(10s, 64ms);
  std::vector<double> intervals;
  for (int i = 0; i < 9; ++i) {
    intervals.push_back(backoff.next_interval().count());
    ASSERT_TRUE(backoff.wait());
  }
  const std::vector<double> expected = {0.001, 0.002, 0.004, 0.008, 0.016,
                                        0.032, 0.064, 0.064, 0.064};
  ASSERT_EQ(intervals.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(intervals[i], expected[i], 1e-9);
  EXPECT_EQ(backoff.waits(), 9);
}

TEST(PollBackoffTest, TheFirstIntervalIsAtLeastAMillisecondAndAtMostTheCeiling) {
  EXPECT_NEAR(PollBackoff(1s, 10ms).next_interval().count(), 0.001, 1e-9);
  EXPECT_NEAR(PollBackoff(1s, Seconds(0.0005)).next_interval().count(), 0.0005, 1e-9);
  EXPECT_NEAR(PollBackoff(1s, 6400ms).next_interval().count(), 0.1, 1e-9);
}

TEST(PollBackoffTest, TheLastWaitEndsAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  PollBackoff backoff(50ms, 1280s);  // the first interval is 20 s: cut at 50 ms
  int waits = 0;
  while (backoff.wait()) ++waits;
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(waits, 1);
  EXPECT_GE(elapsed, 50ms);
  EXPECT_LT(elapsed, 10s);  // the interval (20 s) was not slept whole
  EXPECT_FALSE(backoff.wait());
}

}  // namespace
}  // namespace draftfeed
