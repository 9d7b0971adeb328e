#include "draftfeed/cuda/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

template <typename Fn>
bool bind(void* handle, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(::dlsym(handle, name));
  return out != nullptr;
}

// Every entry point, or none: a library missing one is not a runtime we can drive.
bool bind_all(void* handle, CudaRuntime& rt) {
  return bind(handle, "cudaGetDeviceCount", rt.get_device_count) &&
         bind(handle, "cudaSetDevice", rt.set_device) &&
         bind(handle, "cudaGetDevice", rt.get_device) &&
         bind(handle, "cudaHostRegister", rt.host_register) &&
         bind(handle, "cudaHostUnregister", rt.host_unregister) &&
         bind(handle, "cudaMalloc", rt.malloc_device) && bind(handle, "cudaFree", rt.free_device) &&
         bind(handle, "cudaStreamCreateWithFlags", rt.stream_create) &&
         bind(handle, "cudaStreamDestroy", rt.stream_destroy) &&
         bind(handle, "cudaEventCreateWithFlags", rt.event_create) &&
         bind(handle, "cudaEventDestroy", rt.event_destroy) &&
         bind(handle, "cudaEventRecord", rt.event_record) &&
         bind(handle, "cudaEventQuery", rt.event_query) &&
         bind(handle, "cudaEventSynchronize", rt.event_synchronize) &&
         bind(handle, "cudaStreamWaitEvent", rt.stream_wait_event) &&
         bind(handle, "cudaMemcpyAsync", rt.memcpy_async) &&
         bind(handle, "cudaGetErrorString", rt.error_string);
}

}  // namespace

const CudaRuntime& cuda_runtime() {
  static const CudaRuntime runtime = [] {
    CudaRuntime result;
    const char* configured = std::getenv("DRAFTFEED_CUDART");
    const char* candidates[] = {configured, "libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                "libcudart.so.11.0"};
    std::string tried;
    for (const char* name : candidates) {
      if (name == nullptr || *name == '\0') continue;
      void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) continue;
      CudaRuntime bound;
      if (bind_all(handle, bound)) {
        bound.available = true;
        bound.detail = std::string("CUDA runtime ") + name + " loaded";
        return bound;
      }
      tried += std::string(tried.empty() ? "" : ", ") + name;
    }
    result.detail = tried.empty()
                        ? "no CUDA runtime found: batches use ordinary (pageable) memory"
                        : "no usable CUDA runtime (" + tried +
                              " lack an entry point draftfeed calls): batches use ordinary memory";
    return result;
  }();
  return runtime;
}

void check_cuda(int code, const char* call, int device) {
  if (code == kCudaSuccess) return;
  const CudaRuntime& rt = cuda_runtime();
  const char* text = rt.error_string != nullptr ? rt.error_string(code) : nullptr;
  throw Error(ErrorKind::kRuntime, std::string(call) + " on cuda:" + std::to_string(device) +
                                       " failed: " + (text != nullptr ? text : "unknown error") +
                                       " (CUDA error " + std::to_string(code) + ")");
}

void make_device_current(int device) {
  const CudaRuntime& rt = cuda_runtime();
  int current = -1;
  if (rt.get_device(&current) == kCudaSuccess && current == device) return;
  check_cuda(rt.set_device(device), "cudaSetDevice", device);
}

int resolve_cuda_device(int requested) {
  if (requested >= 0) return requested;
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (local_rank != nullptr && *local_rank != '\0') {
    char* end = nullptr;
    const long value = std::strtol(local_rank, &end, 10);
    require(*end == '\0' && value >= 0 && value < 1 << 16, ErrorKind::kInvalidArgument,
            std::string("LOCAL_RANK must be a device index, got '") + local_rank + "'");
    return static_cast<int>(value);
  }
  return 0;
}

}  // namespace draftfeed
