#include "draftfeed/common/fault_guard.h"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace draftfeed {

namespace {

// One active guard on a thread; guards nest through `previous`.
struct Guard {
  sigjmp_buf jump;
  Guard* previous;
};

// The innermost active guard of this thread. Written before any guarded read of the thread, so the
// handler's access never allocates the thread's TLS block.
thread_local Guard* active_guard = nullptr;
// The faulting address of the last fault a guard of this thread caught (written by the handler).
thread_local const void* last_fault_address = nullptr;

std::atomic<std::uint64_t> fault_count{0};

// The action that was installed before ours (chained to for faults outside guards). Written under
// `install_mutex` before ours is installed on top of it.
struct sigaction previous_action {};
std::mutex install_mutex;

void on_sigbus(int signal, siginfo_t* info, void* context);

bool is_ours(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == &on_sigbus;
}

// A SIGBUS that is not ours to handle: as if our handler were not there.
void pass_on(int signal, siginfo_t* info, void* context) {
  const struct sigaction& before = previous_action;
  if ((before.sa_flags & SA_SIGINFO) != 0 && before.sa_sigaction != nullptr) {
    before.sa_sigaction(signal, info, context);
    return;
  }
  if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN &&
      before.sa_handler != nullptr) {
    before.sa_handler(signal);
    return;
  }
  // The default action: restore it. A fault re-executes the instruction and now kills the process
  // (with a core dump, as without us); a SIGBUS sent by kill() is raised again.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ::sigaction(SIGBUS, &default_action, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(SIGBUS);
}

void on_sigbus(int signal, siginfo_t* info, void* context) {
  Guard* guard = active_guard;
  if (guard == nullptr) {
    pass_on(signal, info, context);
    return;
  }
  fault_count.fetch_add(1, std::memory_order_relaxed);
  last_fault_address = info != nullptr ? info->si_addr : nullptr;
  // SA_NODEFER left SIGBUS unblocked, so the jump needs no signal-mask restore (sigsetjmp(.., 0)).
  siglongjmp(guard->jump, 1);
}

// Makes sure our handler is the installed one (see the header for why this is checked each time).
void ensure_handler() {
  struct sigaction current {};
  if (::sigaction(SIGBUS, nullptr, &current) == 0 && is_ours(current)) return;
  std::lock_guard lock(install_mutex);
  if (::sigaction(SIGBUS, nullptr, &current) != 0 || is_ours(current)) return;
  previous_action = current;
  struct sigaction ours {};
  ours.sa_sigaction = &on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  ::sigaction(SIGBUS, &ours, nullptr);
}

// The guard itself, the handler already checked.
bool run_guarded(void (*read)(void* context), void* context) {
  Guard guard;
  guard.previous = active_guard;
  if (sigsetjmp(guard.jump, 0) != 0) {
    // Back from the handler: the read faulted. (Only `guard`, unchanged since sigsetjmp, is used.)
    active_guard = guard.previous;
    return false;
  }
  active_guard = &guard;
  try {
    read(context);
  } catch (...) {
    active_guard = guard.previous;
    throw;
  }
  active_guard = guard.previous;
  return true;
}

struct Copy {
  void* dst;
  const void* src;
  std::size_t n;
};

void copy_bytes(void* context) {
  const auto* c = static_cast<const Copy*>(context);
  std::memcpy(c->dst, c->src, c->n);
}

}  // namespace

bool guard_mapped_reads_raw(void (*read)(void* context), void* context) {
  ensure_handler();
  return run_guarded(read, context);
}

bool guarded_copy(void* dst, const void* src, std::size_t n) {
  if (n == 0) return true;
  Copy copy{dst, src, n};
  return guard_mapped_reads_raw(copy_bytes, &copy);
}

MappedReadScope::MappedReadScope() { ensure_handler(); }

bool MappedReadScope::guard_raw(void (*read)(void* context), void* context) {
  return run_guarded(read, context);
}

bool MappedReadScope::copy(void* dst, const void* src, std::size_t n) const {
  if (n == 0) return true;
  Copy copy{dst, src, n};
  return run_guarded(copy_bytes, &copy);
}

std::uint64_t guarded_faults() { return fault_count.load(std::memory_order_relaxed); }

const void* last_guarded_fault_address() { return last_fault_address; }

}  // namespace draftfeed
