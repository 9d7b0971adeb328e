// Device memory for the device stage's batches (cudaMalloc on the rank's device). Freed once the
// consumer's stream is done reading it, by the device worker.
#pragma once

#include <cstddef>
#include <memory>

#include "draftfeed/cuda/device_worker.h"
#include "draftfeed/cuda/memory_block.h"

namespace draftfeed {

class DeviceBuffer : public MemoryBlock {
 public:
  // Allocates `bytes` on the worker's device (on the worker's thread); throws Error on failure.
  DeviceBuffer(std::size_t bytes, std::shared_ptr<DeviceWorker> worker);
  ~DeviceBuffer() override;
};

}  // namespace draftfeed
