#include "draftfeed/common/run_workers.h"

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace draftfeed {

void run_workers(unsigned threads,
                 const std::function<void(unsigned index, const std::atomic<bool>& stop)>& work) {
  std::atomic<bool> stop{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto guarded = [&](unsigned index) {
    try {
      work(index, stop);
    } catch (...) {
      const std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
      stop = true;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(guarded, i);
  guarded(0);
  for (auto& thread : pool) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace draftfeed
