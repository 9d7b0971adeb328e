// When a read-ahead asks again for something under way too long (an open on a slow file system, a
// request a server queued or preempted): after `factor` x what it is expected to take, and at
// least `min_wait`; the first answer wins. The two read-aheads differ only in what they expect:
// the file read-ahead the median of its latest opens (file_read_ahead.h), the request lookahead
// the prompt's predicted service time (service_time_model.h). A factor of 0 never asks again.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

struct HedgeRule {
  double factor = 2;
  std::chrono::duration<double> min_wait{1.0};

  bool enabled() const { return factor > 0; }
  std::chrono::duration<double> delay(std::chrono::duration<double> expected) const {
    return std::max(expected * factor, min_wait);
  }
  // Error kInvalidArgument naming the fields as the caller's options name them.
  void validate(const std::string& factor_name, const std::string& min_wait_name) const {
    require(factor >= 0, ErrorKind::kInvalidArgument,
            factor_name + " must be >= 0 (0: never), got " + std::to_string(factor));
    require(min_wait.count() >= 0, ErrorKind::kInvalidArgument,
            min_wait_name + " must be >= 0, got " + std::to_string(min_wait.count()));
  }
};

}  // namespace draftfeed
