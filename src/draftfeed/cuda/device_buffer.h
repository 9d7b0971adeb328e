// Device memory for the device stage's batches, from a DeviceAllocator (cudaMalloc on the rank's
// device by default, blocks torch made with torch). Given back once the consumer's stream is done
// reading it, by the device worker: an event query, never a device-wide synchronisation.
#pragma once

#include <cstddef>
#include <memory>

#include "draftfeed/cuda/device_allocator.h"
#include "draftfeed/cuda/device_worker.h"
#include "draftfeed/cuda/memory_block.h"

namespace draftfeed {

class DeviceBuffer : public MemoryBlock {
 public:
  // Takes `bytes` on the worker's device from `allocator` (on the worker's thread); throws Error on
  // failure.
  DeviceBuffer(std::size_t bytes, std::shared_ptr<DeviceWorker> worker,
               std::shared_ptr<DeviceAllocator> allocator);
  ~DeviceBuffer() override;

 private:
  const std::shared_ptr<DeviceAllocator> allocator_;
};

}  // namespace draftfeed
