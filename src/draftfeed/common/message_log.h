// Warnings a stage wants a person to read (a failed request attempt, a file left in place), kept
// for whoever reports them: the command line prints them to stderr as they come, the Python package
// drains them into `logging` from the consumer's thread (worker threads never call into Python).
//
// Bounded: past `capacity` unread messages the oldest are dropped and counted, so a run that fails
// every request for hours does not grow memory. Thread safety: every method may be called from any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace draftfeed {

class MessageLog {
 public:
  // `echo`: also print each message to stderr as "draftfeed: warning: ..." when it is logged.
  explicit MessageLog(bool echo, std::size_t capacity = 512);

  // Kept (and echoed) as printable(message): one line, no control characters.
  void warn(std::string message);
  // The unread messages, oldest first, and how many were dropped unread since the last call.
  struct Drained {
    std::vector<std::string> messages;
    std::int64_t overflowed = 0;
  };
  Drained drain();

 private:
  const bool echo_;
  const std::size_t capacity_;
  std::mutex mutex_;
  std::deque<std::string> unread_;
  std::int64_t overflowed_ = 0;
};

}  // namespace draftfeed
