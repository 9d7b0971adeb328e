// Memory that holds batches: host memory, ordinary (pageable) or page-locked, or device memory.
// Page-locked and device memory may be read by the device after the batch that used it was
// released (a copy still queued on a stream): they carry a ReadFence, and whoever rewrites or
// frees them waits for it first. Pageable memory has none and costs no CUDA call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "draftfeed/cuda/read_fence.h"

namespace draftfeed {

class MemoryBlock {
 public:
  virtual ~MemoryBlock() = default;
  MemoryBlock(const MemoryBlock&) = delete;
  MemoryBlock& operator=(const MemoryBlock&) = delete;

  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  // The CUDA device whose memory this is; -1 for host memory.
  int device() const { return device_; }
  bool pinned() const { return device_ < 0 && fence_ != nullptr; }
  // The device's pending reads; null when the device cannot read this memory asynchronously.
  const std::shared_ptr<ReadFence>& fence() const { return fence_; }

 protected:
  MemoryBlock() = default;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
  std::shared_ptr<ReadFence> fence_;
};

}  // namespace draftfeed
