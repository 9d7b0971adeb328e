// A fixed number of threads working through a shared job list together, for one-shot jobs
// (scanning, converting or writing a whole cache) where a thread pool would be overkill.
//
// Why one helper: each of those jobs needs the same care: the caller's thread works too, the first
// exception any worker throws stops the others at their next item and is rethrown to the caller
// once every thread has joined (never from a worker, where it would end the process).
// Thread safety: `work` runs on `threads` threads at once.
#pragma once

#include <atomic>
#include <functional>

namespace draftfeed {

// Runs `work(index, stop)` for index 0..threads-1, index 0 on the calling thread, and returns when
// all have returned. `stop` turns true once any of them has thrown: `work` checks it between items.
// The first exception thrown is rethrown here after the join. `threads` 0 is taken as 1.
void run_workers(unsigned threads,
                 const std::function<void(unsigned index, const std::atomic<bool>& stop)>& work);

}  // namespace draftfeed
