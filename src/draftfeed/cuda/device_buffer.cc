#include "draftfeed/cuda/device_buffer.h"

#include <utility>

#include "draftfeed/cuda/cuda_runtime.h"

namespace draftfeed {

DeviceBuffer::DeviceBuffer(std::size_t bytes, std::shared_ptr<DeviceWorker> worker) {
  size_ = bytes;
  device_ = worker->device();
  worker->run([&] {
    void* memory = nullptr;
    check_cuda(cuda_runtime().malloc_device(&memory, bytes == 0 ? 1 : bytes), "cudaMalloc",
               device_);
    data_ = static_cast<std::uint8_t*>(memory);
  });
  fence_ = ReadFence::create(std::move(worker));
}

DeviceBuffer::~DeviceBuffer() {
  // The consumer's stream may still read it: free it once every marked read is complete.
  const std::shared_ptr<DeviceWorker> worker = fence_->worker();
  worker->post_when([fence = fence_] { return fence->passed(); },
                    [memory = data_] { cuda_runtime().free_device(memory); });
}

}  // namespace draftfeed
