#include "draftfeed/cuda/device_buffer.h"

#include <utility>

namespace draftfeed {

DeviceBuffer::DeviceBuffer(std::size_t bytes, std::shared_ptr<DeviceWorker> worker,
                           std::shared_ptr<DeviceAllocator> allocator)
    : allocator_(std::move(allocator)) {
  size_ = bytes;
  device_ = worker->device();
  worker->run([&] { data_ = static_cast<std::uint8_t*>(allocator_->allocate(bytes, device_)); });
  fence_ = ReadFence::create(std::move(worker));
}

DeviceBuffer::~DeviceBuffer() {
  // The consumer's stream may still read it: give it back once every marked read is complete.
  const std::shared_ptr<DeviceWorker> worker = fence_->worker();
  worker->post_when([fence = fence_] { return fence->passed(); },
                    [allocator = allocator_, memory = data_, device = device_] {
                      allocator->release(memory, device);
                    });
}

}  // namespace draftfeed
