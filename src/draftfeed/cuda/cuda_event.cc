#include "draftfeed/cuda/cuda_event.h"

#include <utility>

namespace draftfeed {

CudaEvent::CudaEvent(std::shared_ptr<DeviceWorker> worker) : worker_(std::move(worker)) {
  check_cuda(cuda_runtime().event_create(&event_, kCudaEventDisableTiming | kCudaEventBlockingSync),
             "cudaEventCreateWithFlags", worker_->device());
}

CudaEvent::~CudaEvent() {
  auto destroy = [event = event_] { cuda_runtime().event_destroy(event); };
  if (worker_->on_worker_thread()) {
    destroy();
  } else {
    worker_->post(destroy);
  }
}

void CudaEvent::record(CudaStream stream) {
  check_cuda(cuda_runtime().event_record(event_, stream), "cudaEventRecord", worker_->device());
}

bool CudaEvent::done() const {
  const int status = cuda_runtime().event_query(event_);
  if (status == kCudaErrorNotReady) return false;
  check_cuda(status, "cudaEventQuery", worker_->device());
  return true;
}

void CudaEvent::make_wait(CudaStream stream) const {
  check_cuda(cuda_runtime().stream_wait_event(stream, event_, 0), "cudaStreamWaitEvent",
             worker_->device());
}

}  // namespace draftfeed
