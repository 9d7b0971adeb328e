// A cancel flag for the work one thread does for one task (a row's fetch), read deep below the
// task's caller: the lookahead's hedged fetches (lookahead_source.h) end the slower of two fetches
// of a row without ending every other request the source has in flight, and without a token in
// every interface between (SampleSource::fetch -> OnlineSampleSource -> VllmClient -> HttpPool).
// Code that blocks (a transfer, a wait for a request slot, a retry's backoff) checks
// CancelScope::cancelled() as it checks its own cancel flag.
//
// Scopes nest (the inner flag is checked while it lives, then the outer one again); a scope
// belongs to the thread that made it.
#pragma once

#include <atomic>

namespace draftfeed {

class CancelScope {
 public:
  // `flag` must outlive the scope; nullptr: nothing to cancel within it.
  explicit CancelScope(const std::atomic<bool>* flag);
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

  // Whether the calling thread's innermost scope's flag is set (false outside any scope).
  static bool cancelled();

 private:
  const std::atomic<bool>* outer_;
};

}  // namespace draftfeed
