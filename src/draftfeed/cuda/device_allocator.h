// Where the device stage's device memory comes from (docs/device_stage.md, "Device memory").
//
// The engine calls allocate() when it makes a device buffer and release() once the device's reads
// of that memory have passed (its ReadFence), both on the device worker's thread with the device
// current. The default takes memory from the CUDA runtime the engine loaded (cudaMalloc, and
// cudaFree: a device-wide synchronisation). GivenDeviceMemory hands out blocks its caller made:
// the Python layer makes them with torch (torch.empty on the device), so that torch's caching
// allocator counts them (torch.cuda.memory_allocated) and frees them without synchronising the
// device, and keeps them alive while any is handed out (`outstanding`).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace draftfeed {

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  // `bytes` of memory on `device` (current on the calling thread); throws Error on failure.
  virtual void* allocate(std::size_t bytes, int device) = 0;
  // Memory from allocate(), once no queued work reads or writes it.
  virtual void release(void* memory, int device) = 0;
};

// cudaMalloc / cudaFree through the loaded runtime.
std::shared_ptr<DeviceAllocator> runtime_device_allocator();

// Blocks of device memory made by the caller, each handed out whole to one request that fits (the
// smallest free one). A request no free block fits (a consumer keeping whole batches makes the
// pool grow) goes to `fallback`, counted in fallback_bytes(). Thread safety: every method from any
// thread.
class GivenDeviceMemory : public DeviceAllocator {
 public:
  struct Block {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
  };
  GivenDeviceMemory(const std::vector<Block>& blocks, std::shared_ptr<DeviceAllocator> fallback);

  void* allocate(std::size_t bytes, int device) override;
  void release(void* memory, int device) override;

  // Given blocks handed out now (the caller must keep them alive while this is not 0).
  std::size_t outstanding() const;
  std::size_t given_bytes() const;
  // Bytes taken from the fallback so far, and how many of those allocations are alive now.
  std::size_t fallback_bytes() const;
  std::size_t fallback_outstanding() const;

 private:
  struct Entry {
    Block block;
    bool in_use = false;
  };
  const std::shared_ptr<DeviceAllocator> fallback_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::vector<void*> fallback_live_;
  std::size_t fallback_bytes_ = 0;
};

}  // namespace draftfeed
