#include "draftfeed/cuda/read_fence.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

std::atomic<std::uint64_t> g_rewrites_while_read{0};
std::atomic<std::uint64_t> g_checks_while_read{0};

}  // namespace

ReadFence::Counts ReadFence::counts() {
  return {g_rewrites_while_read.load(), g_checks_while_read.load()};
}

std::shared_ptr<ReadFence> ReadFence::create(std::shared_ptr<DeviceWorker> worker) {
  return std::shared_ptr<ReadFence>(new ReadFence(std::move(worker)));
}

ReadFence::~ReadFence() {
  std::vector<void*> events;
  for (const Mark& mark : marks_) events.push_back(mark.event);
  if (events.empty()) return;
  // An event still pending is released by the runtime once it completes.
  auto destroy = [events = std::move(events)] {
    for (void* event : events) cuda_runtime().event_destroy(event);
  };
  if (worker_->on_worker_thread()) {
    destroy();
  } else {
    worker_->post(destroy);
  }
}

void ReadFence::record_locked(CudaStream stream) {
  const CudaRuntime& rt = cuda_runtime();
  Mark* mark = nullptr;
  for (Mark& m : marks_) {
    if (m.stream == stream) mark = &m;
  }
  if (mark == nullptr) {
    void* event = nullptr;
    check_cuda(rt.event_create(&event, kCudaEventDisableTiming | kCudaEventBlockingSync),
               "cudaEventCreateWithFlags", worker_->device());
    marks_.push_back({stream, event, false, 0});
    mark = &marks_.back();
  }
  check_cuda(rt.event_record(mark->event, stream), "cudaEventRecord", worker_->device());
  mark->pending = true;
  ++mark->generation;
}

void ReadFence::mark_reads_on(CudaStream stream) {
  {
    std::lock_guard lock(mutex_);
    ++posted_;
  }
  worker_->post([self = shared_from_this(), stream] {
    std::lock_guard lock(self->mutex_);
    try {
      self->record_locked(stream);
    } catch (const std::exception& e) {
      if (self->error_.empty()) self->error_ = e.what();
    }
    --self->posted_;
    self->recorded_.notify_all();
  });
}

void ReadFence::mark_reads_on_now(CudaStream stream) {
  std::lock_guard lock(mutex_);
  record_locked(stream);
}

void ReadFence::wait_posted(std::unique_lock<std::mutex>& lock) {
  recorded_.wait(lock, [this] { return posted_ == 0; });
  require(error_.empty(), ErrorKind::kRuntime,
          "a batch buffer's pending device reads could not be tracked: " + error_);
}

bool ReadFence::passed() {
  std::lock_guard lock(mutex_);
  if (posted_ != 0) return false;
  const CudaRuntime& rt = cuda_runtime();
  for (Mark& mark : marks_) {
    if (!mark.pending) continue;
    const int status = rt.event_query(mark.event);
    if (status == kCudaErrorNotReady) {
      g_checks_while_read.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    check_cuda(status, "cudaEventQuery", worker_->device());
    mark.pending = false;
  }
  return true;
}

void ReadFence::wait() {
  const CudaRuntime& rt = cuda_runtime();
  std::unique_lock lock(mutex_);
  for (;;) {
    wait_posted(lock);
    std::vector<std::pair<void*, unsigned>> pending;
    for (const Mark& mark : marks_) {
      if (mark.pending) pending.emplace_back(mark.event, mark.generation);
    }
    if (pending.empty()) return;
    if (std::any_of(pending.begin(), pending.end(),
                    [&](const auto& p) { return rt.event_query(p.first) == kCudaErrorNotReady; })) {
      g_rewrites_while_read.fetch_add(1, std::memory_order_relaxed);
    }
    // Without the lock: the worker may record other marks of this fence meanwhile.
    lock.unlock();
    for (const auto& [event, generation] : pending) {
      check_cuda(rt.event_synchronize(event), "cudaEventSynchronize", worker_->device());
    }
    lock.lock();
    for (Mark& mark : marks_) {
      for (const auto& [event, generation] : pending) {
        if (mark.event == event && mark.generation == generation) mark.pending = false;
      }
    }
  }
}

void ReadFence::order_after(CudaStream stream) {
  const CudaRuntime& rt = cuda_runtime();
  std::unique_lock lock(mutex_);
  wait_posted(lock);
  bool counted = false;
  for (const Mark& mark : marks_) {
    // Work queued on `stream` itself is ordered before what follows there.
    if (!mark.pending || mark.stream == stream) continue;
    if (!counted && rt.event_query(mark.event) == kCudaErrorNotReady) {
      g_rewrites_while_read.fetch_add(1, std::memory_order_relaxed);
      counted = true;
    }
    check_cuda(rt.stream_wait_event(stream, mark.event, 0), "cudaStreamWaitEvent",
               worker_->device());
  }
}

}  // namespace draftfeed
