// Reads of memory-mapped files that survive the file shrinking underneath them.
//
// Why: the engine reads hidden states straight out of mapped cache files (one copy). When another
// process truncates such a file while it is mapped (a writer rewriting it in place, a cleanup job,
// a full disk), a read of a page past the new end raises SIGBUS, whose default action kills the
// process: the trainer dies with no message. Reads of mapped bytes that may race with such a change
// run inside `guard_mapped_reads`, which turns a SIGBUS raised on the calling thread while the
// guard is active into a `false` return; the caller drops the sample and says why.
//
// How: a SIGBUS handler (SA_SIGINFO | SA_NODEFER | SA_ONSTACK), installed at the first guard,
// siglongjmps back into the guard of the faulting thread. A SIGBUS outside any guard (or on a
// thread without one) goes to the handler that was installed before ours, or, when that was the
// default action, kills the process as it would have. Each guard checks that the handler is still
// ours (Python's `faulthandler.enable()`, a JVM or a debugger may install their own later) and puts
// it back on top, passing other faults on to the newcomer. The check is one system call per guard,
// so guards cover large reads (a chunk of a batch copy, a whole header), not single loads.
//
// The guarded function is left by a jump: it must not own objects with destructors, take locks,
// allocate or throw past state it cannot restore. Plain loops over the mapped bytes (memcpy, the
// cast kernels, compares, finiteness scans) qualify; C++ exceptions thrown by the function do
// propagate normally.
// Thread safety: any number of threads may run guards at once; a guard covers its own thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace draftfeed {

// Runs `read(context)`; returns false when it raised SIGBUS (it was abandoned at that point),
// true when it returned normally. Guards nest.
bool guard_mapped_reads_raw(void (*read)(void* context), void* context);

// The same for a callable (a lambda); see the rules above for what it may do.
template <typename Read>
bool guard_mapped_reads(Read&& read) {
  using Fn = std::remove_reference_t<Read>;
  return guard_mapped_reads_raw([](void* context) { (*static_cast<Fn*>(context))(); },
                                const_cast<void*>(static_cast<const void*>(&read)));
}

// memcpy(dst, src, n) that returns false instead of crashing when `src` (a mapping) faults.
bool guarded_copy(void* dst, const void* src, std::size_t n);

// Many small guards in a row on one thread (a parse that copies each piece of a mapped file out as
// it goes, a walk over a value's elements): the handler is checked once, when the scope is made,
// instead of at every guard, so that each guard costs a sigsetjmp, not a system call (opening a
// dataset of 500,000 rows takes some 3,000 guards). Keep a scope short-lived, as a guard is: a
// handler installed over ours while it lives is seen at the next check only.
class MappedReadScope {
 public:
  MappedReadScope();
  // As guard_mapped_reads / guarded_copy.
  template <typename Read>
  bool guard(Read&& read) const {
    using Fn = std::remove_reference_t<Read>;
    return guard_raw([](void* context) { (*static_cast<Fn*>(context))(); },
                     const_cast<void*>(static_cast<const void*>(&read)));
  }
  bool copy(void* dst, const void* src, std::size_t n) const;

 private:
  static bool guard_raw(void (*read)(void* context), void* context);
};

// SIGBUS faults turned into `false` returns since the process started (all threads).
std::uint64_t guarded_faults();

// The address whose read raised the last SIGBUS a guard of this thread caught (null before any):
// a guard over reads of two mappings (a cache file's token ids against a dataset shard's) tells
// by it which of the two shrank.
const void* last_guarded_fault_address();

}  // namespace draftfeed
