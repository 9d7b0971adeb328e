// A CUDA event of draftfeed's own (no timing, blocking waits), created and recorded on a thread
// with the device current and destroyed by the device worker, whichever thread lets it go.
#pragma once

#include <memory>

#include "draftfeed/cuda/cuda_runtime.h"
#include "draftfeed/cuda/device_worker.h"

namespace draftfeed {

class CudaEvent {
 public:
  // On a thread with the worker's device current.
  explicit CudaEvent(std::shared_ptr<DeviceWorker> worker);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // On a thread with the device current: the event completes after what `stream` has queued.
  void record(CudaStream stream);
  // On a thread with the device current: whether it completed.
  bool done() const;
  // On a thread with the device current: `stream` waits for it, on the device.
  void make_wait(CudaStream stream) const;

 private:
  std::shared_ptr<DeviceWorker> worker_;
  void* event_ = nullptr;
};

}  // namespace draftfeed
