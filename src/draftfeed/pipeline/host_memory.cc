#include "draftfeed/pipeline/host_memory.h"

#include <sys/mman.h>

#include <new>

#include "draftfeed/cuda/cuda_runtime.h"

namespace draftfeed {

PinningSupport pinning_support() {
  const CudaRuntime& rt = cuda_runtime();
  return {rt.available, rt.detail};
}

HostBuffer::HostBuffer(std::size_t bytes, const std::shared_ptr<DeviceWorker>& pin_with) {
  size_ = bytes;
  if (bytes == 0) return;
  // mmap gives page-aligned, zeroed memory that the kernel backs lazily, and returns it on free.
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<std::uint8_t*>(addr);
  if (!pin_with) return;
  bool pinned = false;
  // cudaHostRegisterDefault = 0. A refusal (no device, too much locked memory) leaves it pageable.
  pin_with->run([&] { pinned = cuda_runtime().host_register(data_, bytes, 0) == kCudaSuccess; });
  if (pinned) fence_ = ReadFence::create(pin_with);
}

HostBuffer::~HostBuffer() {
  if (data_ == nullptr) return;
  if (!fence_) {
    ::munmap(data_, size_);
    return;
  }
  // A copy from it may still be queued: unregister and unmap once the device has read it.
  const std::shared_ptr<DeviceWorker> worker = fence_->worker();
  worker->post_when([fence = fence_] { return fence->passed(); },
                    [data = data_, size = size_] {
                      cuda_runtime().host_unregister(data);
                      ::munmap(data, size);
                    });
}

}  // namespace draftfeed
