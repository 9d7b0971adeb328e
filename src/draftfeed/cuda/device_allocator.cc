#include "draftfeed/cuda/device_allocator.h"

#include <algorithm>
#include <utility>

#include "draftfeed/common/error.h"
#include "draftfeed/cuda/cuda_runtime.h"

namespace draftfeed {

namespace {

class RuntimeDeviceAllocator : public DeviceAllocator {
 public:
  void* allocate(std::size_t bytes, int device) override {
    void* memory = nullptr;
    check_cuda(cuda_runtime().malloc_device(&memory, bytes == 0 ? 1 : bytes), "cudaMalloc", device);
    return memory;
  }
  void release(void* memory, int /*device*/) override { cuda_runtime().free_device(memory); }
};

}  // namespace

std::shared_ptr<DeviceAllocator> runtime_device_allocator() {
  static const std::shared_ptr<DeviceAllocator> allocator =
      std::make_shared<RuntimeDeviceAllocator>();
  return allocator;
}

GivenDeviceMemory::GivenDeviceMemory(const std::vector<Block>& blocks,
                                     std::shared_ptr<DeviceAllocator> fallback)
    : fallback_(std::move(fallback)) {
  for (const Block& block : blocks) {
    require(block.address != 0 && block.bytes > 0, ErrorKind::kInvalidArgument,
            "a device memory block needs an address and a size");
    entries_.push_back({block, false});
  }
}

void* GivenDeviceMemory::allocate(std::size_t bytes, int device) {
  {
    std::lock_guard lock(mutex_);
    Entry* best = nullptr;
    for (Entry& entry : entries_) {
      if (entry.in_use || entry.block.bytes < bytes) continue;
      if (best == nullptr || entry.block.bytes < best->block.bytes) best = &entry;
    }
    if (best != nullptr) {
      best->in_use = true;
      return reinterpret_cast<void*>(best->block.address);  // NOLINT(performance-no-int-to-ptr)
    }
  }
  require(fallback_ != nullptr, ErrorKind::kRuntime,
          "no given device memory block of " + std::to_string(bytes) + " bytes is free");
  void* memory = fallback_->allocate(bytes, device);
  std::lock_guard lock(mutex_);
  fallback_live_.push_back(memory);
  fallback_bytes_ += bytes;
  return memory;
}

void GivenDeviceMemory::release(void* memory, int device) {
  {
    std::lock_guard lock(mutex_);
    const auto address = reinterpret_cast<std::uintptr_t>(memory);
    for (Entry& entry : entries_) {
      if (entry.block.address == address && entry.in_use) {
        entry.in_use = false;
        return;
      }
    }
    auto found = std::find(fallback_live_.begin(), fallback_live_.end(), memory);
    if (found == fallback_live_.end()) return;  // not ours: nothing to give back
    fallback_live_.erase(found);
  }
  fallback_->release(memory, device);
}

std::size_t GivenDeviceMemory::outstanding() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.in_use; }));
}

std::size_t GivenDeviceMemory::given_bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const Entry& entry : entries_) total += entry.block.bytes;
  return total;
}

std::size_t GivenDeviceMemory::fallback_bytes() const {
  std::lock_guard lock(mutex_);
  return fallback_bytes_;
}

std::size_t GivenDeviceMemory::fallback_outstanding() const {
  std::lock_guard lock(mutex_);
  return fallback_live_.size();
}

}  // namespace draftfeed
