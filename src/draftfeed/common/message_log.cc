#include "draftfeed/common/message_log.h"

#include <cstdio>
#include <utility>

#include "draftfeed/common/printable.h"

namespace draftfeed {

MessageLog::MessageLog(bool echo, std::size_t capacity)
    : echo_(echo), capacity_(capacity == 0 ? 1 : capacity) {}

void MessageLog::warn(std::string message) {
  // One line each, whatever a server's handle or a file's name carried into it.
  message = printable(message);
  if (echo_) std::fprintf(stderr, "draftfeed: warning: %s\n", message.c_str());
  std::lock_guard lock(mutex_);
  if (unread_.size() == capacity_) {
    unread_.pop_front();
    ++overflowed_;
  }
  unread_.push_back(std::move(message));
}

MessageLog::Drained MessageLog::drain() {
  Drained out;
  std::lock_guard lock(mutex_);
  out.messages.assign(std::make_move_iterator(unread_.begin()),
                      std::make_move_iterator(unread_.end()));
  unread_.clear();
  out.overflowed = std::exchange(overflowed_, 0);
  return out;
}

}  // namespace draftfeed
