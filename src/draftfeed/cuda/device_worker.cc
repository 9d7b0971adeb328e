#include "draftfeed/cuda/device_worker.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "draftfeed/cuda/cuda_runtime.h"

namespace draftfeed {

struct DeviceWorker::State {
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;  // the queue and the waiting tasks became empty
  std::deque<std::function<void()>> queue;
  std::vector<std::pair<std::function<bool()>, std::function<void()>>> waiting;
  bool stop = false;
  bool busy = false;  // tasks taken out of the lists are being run
};

namespace {

// When the runtime sees no device at all (a CPU machine with torch's CUDA build, whose runtime
// then fails every call with "driver version is insufficient", error 35, or "no CUDA-capable
// device", error 100): what to say instead of the failed call's long message.
std::optional<std::string> no_device_text(const CudaRuntime& rt) {
  int count = 0;
  const int code = rt.get_device_count != nullptr ? rt.get_device_count(&count) : kCudaSuccess;
  if (code == kCudaSuccess && count > 0) return std::nullopt;
  return std::string("no CUDA device: batches stay in host memory");
}

}  // namespace

DeviceWorker::DeviceWorker(int device) : device_(device), state_(std::make_shared<State>()) {}

std::shared_ptr<DeviceWorker> DeviceWorker::start(int device, std::string* why) {
  const CudaRuntime& rt = cuda_runtime();
  if (!rt.available) {
    if (why != nullptr) *why = rt.detail;
    return nullptr;
  }
  std::shared_ptr<DeviceWorker> worker(new DeviceWorker(device));
  std::promise<std::string> started;
  std::future<std::string> result = started.get_future();
  std::thread thread([state = worker->state_, device, started = std::move(started)]() mutable {
    try {
      make_device_current(device);
      started.set_value("");
    } catch (const std::exception& e) {
      started.set_value(e.what());
      return;
    }
    loop(state);
  });
  worker->thread_id_ = thread.get_id();
  const std::string failure = result.get();
  if (!failure.empty()) {
    thread.join();
    if (why != nullptr) *why = no_device_text(rt).value_or(failure);
    return nullptr;
  }
  // The thread owns its state; it ends once the last owner of this object is gone (see ~).
  thread.detach();
  return worker;
}

std::shared_ptr<DeviceWorker> DeviceWorker::for_device(int device, std::string* why) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<DeviceWorker>> alive;
  std::lock_guard lock(mutex);
  if (auto worker = alive[device].lock()) return worker;
  auto worker = start(device, why);
  if (worker) alive[device] = worker;
  return worker;
}

DeviceWorker::~DeviceWorker() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
}

bool DeviceWorker::on_worker_thread() const { return std::this_thread::get_id() == thread_id_; }

void DeviceWorker::post(std::function<void()> task) {
  {
    std::lock_guard lock(state_->mutex);
    state_->queue.push_back(std::move(task));
  }
  state_->wake.notify_all();
}

void DeviceWorker::run(const std::function<void()>& task) {
  if (on_worker_thread()) {
    task();
    return;
  }
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  post([&task, &done] {
    try {
      task();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  finished.get();
}

void DeviceWorker::post_when(std::function<bool()> ready, std::function<void()> task) {
  {
    std::lock_guard lock(state_->mutex);
    state_->waiting.emplace_back(std::move(ready), std::move(task));
  }
  state_->wake.notify_all();
}

void DeviceWorker::settle() {
  if (on_worker_thread()) return;
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(
      lock, [&] { return state_->queue.empty() && state_->waiting.empty() && !state_->busy; });
}

void DeviceWorker::loop(const std::shared_ptr<State>& state) {
  // Tasks are run and destroyed without the lock: destroying one may drop the last owner of the
  // DeviceWorker, whose destructor takes the lock.
  std::unique_lock lock(state->mutex);
  for (;;) {
    if (!state->queue.empty()) {
      std::function<void()> task = std::move(state->queue.front());
      state->queue.pop_front();
      state->busy = true;
      lock.unlock();
      try {
        task();
      } catch (...) {  // NOLINT(bugprone-empty-catch): see post()
      }
      task = nullptr;
      lock.lock();
      state->busy = false;
      continue;
    }
    if (!state->waiting.empty()) {
      auto waiting = std::move(state->waiting);
      state->waiting.clear();
      state->busy = true;
      lock.unlock();
      decltype(waiting) still;
      for (auto& [ready, task] : waiting) {
        bool now = true;
        try {
          now = ready();
        } catch (...) {  // a failed check cannot become true: run the task (it frees memory)
        }
        if (now) {
          try {
            task();
          } catch (...) {  // NOLINT(bugprone-empty-catch): a free that failed has nothing to undo
          }
        } else {
          still.emplace_back(std::move(ready), std::move(task));
        }
      }
      waiting.clear();
      lock.lock();
      state->busy = false;
      for (auto& entry : still) state->waiting.push_back(std::move(entry));
      if (!state->waiting.empty()) {
        state->wake.wait_for(lock, std::chrono::microseconds(500),
                             [&] { return !state->queue.empty(); });
      }
      continue;
    }
    state->idle.notify_all();
    if (state->stop) return;
    state->wake.wait(lock);
  }
}

}  // namespace draftfeed
