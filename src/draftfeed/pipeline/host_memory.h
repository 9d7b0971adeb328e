// Batch memory on the host: page-aligned allocations, page-locked ("pinned") through the CUDA
// runtime when one is present at run time (cuda/cuda_runtime.h: loaded with dlopen, so draftfeed
// needs no CUDA to build or run).
//
// Page-locked memory is registered, and later unregistered, by the device worker (the rank's
// device current, never the caller's thread), and carries a ReadFence: a copy queued from it may
// run after the batch was released, so it is rewritten only once that fence has passed (the
// buffer pool waits for it) and freed only after that too (the worker frees it then).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "draftfeed/cuda/device_worker.h"
#include "draftfeed/cuda/memory_block.h"

namespace draftfeed {

class HostBuffer : public MemoryBlock {
 public:
  // Allocates `bytes` (page-aligned, zero-filled); page-locks it on `pin_with`'s device when
  // given (stays pageable if the runtime refuses).
  HostBuffer(std::size_t bytes, const std::shared_ptr<DeviceWorker>& pin_with);
  ~HostBuffer() override;
};

// Whether a CUDA runtime could be loaded (and why not), for the loader's summary.
struct PinningSupport {
  bool available = false;
  std::string detail;  // library loaded, or the reason pinning is off
};
PinningSupport pinning_support();

}  // namespace draftfeed
