#include "draftfeed/pipeline/host_memory.h"

#include <dlfcn.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace draftfeed {

namespace {

// The two entry points of the CUDA runtime we use (cudaHostRegister / cudaHostUnregister).
using HostRegisterFn = int (*)(void* ptr, std::size_t size, unsigned int flags);
using HostUnregisterFn = int (*)(void* ptr);

struct CudaRuntime {
  HostRegisterFn host_register = nullptr;
  HostUnregisterFn host_unregister = nullptr;
  PinningSupport support;
};

const CudaRuntime& cuda_runtime() {
  static const CudaRuntime runtime = [] {
    CudaRuntime result;
    const char* configured = std::getenv("DRAFTFEED_CUDART");
    const char* candidates[] = {configured, "libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                "libcudart.so.11.0"};
    for (const char* name : candidates) {
      if (name == nullptr || *name == '\0') continue;
      void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) continue;
      result.host_register = reinterpret_cast<HostRegisterFn>(::dlsym(handle, "cudaHostRegister"));
      result.host_unregister =
          reinterpret_cast<HostUnregisterFn>(::dlsym(handle, "cudaHostUnregister"));
      if (result.host_register != nullptr && result.host_unregister != nullptr) {
        result.support = {true, std::string("CUDA runtime ") + name + " loaded"};
        return result;
      }
      result.host_register = nullptr;
      result.host_unregister = nullptr;
    }
    result.support = {false, "no CUDA runtime found: batches use ordinary (pageable) memory"};
    return result;
  }();
  return runtime;
}

}  // namespace

PinningSupport pinning_support() { return cuda_runtime().support; }

HostBuffer::HostBuffer(std::size_t bytes, bool try_pin) : size_(bytes) {
  if (bytes == 0) return;
  // mmap gives page-aligned, zeroed memory that the kernel backs lazily, and returns it on free.
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<std::uint8_t*>(addr);
  if (try_pin) {
    const CudaRuntime& runtime = cuda_runtime();
    // cudaHostRegisterDefault = 0; cudaSuccess = 0.
    if (runtime.support.available && runtime.host_register(data_, bytes, 0) == 0) pinned_ = true;
  }
}

HostBuffer::~HostBuffer() {
  if (data_ == nullptr) return;
  if (pinned_) cuda_runtime().host_unregister(data_);
  ::munmap(data_, size_);
}

}  // namespace draftfeed
