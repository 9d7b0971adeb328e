#include "draftfeed/common/cancel_scope.h"

namespace draftfeed {

namespace {
thread_local const std::atomic<bool>* current_flag = nullptr;
}  // namespace

CancelScope::CancelScope(const std::atomic<bool>* flag) : outer_(current_flag) {
  current_flag = flag;
}

CancelScope::~CancelScope() { current_flag = outer_; }

bool CancelScope::cancelled() {
  return current_flag != nullptr && current_flag->load(std::memory_order_relaxed);
}

}  // namespace draftfeed
