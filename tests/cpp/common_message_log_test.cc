// MessageLog: warnings kept oldest first until drained, bounded (the oldest dropped and counted),
// echoed to stderr only when asked, safe from many threads.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/message_log.h"

namespace draftfeed {
namespace {

TEST(CommonMessageLog, DrainsOldestFirstAndEmpties) {
  MessageLog log(/*echo=*/false);
  log.warn("first");
  log.warn("second");
  const MessageLog::Drained drained = log.drain();
  EXPECT_EQ(drained.messages, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(drained.overflowed, 0);
  EXPECT_TRUE(log.drain().messages.empty());
}

TEST(CommonMessageLog, PastItsCapacityDropsTheOldestAndCountsThem) {
  MessageLog log(/*echo=*/false, /*capacity=*/3);
  for (int i = 1; i <= 5; ++i) log.warn("m" + std::to_string(i));
  MessageLog::Drained drained = log.drain();
  EXPECT_EQ(drained.messages, (std::vector<std::string>{"m3", "m4", "m5"}));
  EXPECT_EQ(drained.overflowed, 2);
  log.warn("m6");
  drained = log.drain();
  EXPECT_EQ(drained.messages, (std::vector<std::string>{"m6"}));
  EXPECT_EQ(drained.overflowed, 0) << "the count is of drops since the last drain";
}

TEST(CommonMessageLog, EchoesToStderrOnlyWhenAsked) {
  ::testing::internal::CaptureStderr();
  MessageLog(/*echo=*/true).warn("said aloud");
  MessageLog(/*echo=*/false).warn("kept quiet");
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "draftfeed: warning: said aloud\n");
}

TEST(CommonMessageLog, LosesNothingUnderConcurrentWriters) {
  MessageLog log(/*echo=*/false, /*capacity=*/100);
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&log, t] {
      for (int i = 0; i < 250; ++i) log.warn(std::to_string(t) + ":" + std::to_string(i));
    });
  }
  std::int64_t seen = 0;
  std::int64_t dropped = 0;
  for (int round = 0; round < 50; ++round) {
    const MessageLog::Drained drained = log.drain();
    seen += static_cast<std::int64_t>(drained.messages.size());
    dropped += drained.overflowed;
  }
  for (auto& w : writers) w.join();
  const MessageLog::Drained rest = log.drain();
  seen += static_cast<std::int64_t>(rest.messages.size());
  dropped += rest.overflowed;
  EXPECT_EQ(seen + dropped, 1000);
}

TEST(CommonMessageLog, KeepsEachMessageOneLineOfPrintableText) {
  // A server's handle is text from outside: a newline would forge a log line, an escape sequence
  // would move the terminal's cursor, a right-to-left override would show the name reversed.
  MessageLog log(/*echo=*/false);
  log.warn(
      "/srv/a\nb\x1b[2J\xe2\x80\xae"
      "c\xff\\d \xe4\xb8\xad.safetensors: left in place");
  const MessageLog::Drained drained = log.drain();
  ASSERT_EQ(drained.messages.size(), 1U);
  EXPECT_EQ(
      drained.messages[0],
      "/srv/a\\x0ab\\x1b[2J\\xe2\\x80\\xaec\\xff\\\\d \xe4\xb8\xad.safetensors: left in place");
}

}  // namespace
}  // namespace draftfeed
