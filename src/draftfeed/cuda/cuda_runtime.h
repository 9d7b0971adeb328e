// The CUDA runtime, loaded at run time with dlopen: draftfeed needs no CUDA to build or run.
// `DRAFTFEED_CUDART` may name the library to load (the tests point it at a stand-in that completes
// copies late, tests/cuda/fake_cudart.cc). Otherwise a runtime already in the process comes first
// (dlopen RTLD_NOLOAD: torch's, when torch was imported; one runtime for the trainer and draftfeed,
// not a system toolkit's beside it), then the library search path. Not found, it is looked for
// again at the next call (torch imported after a first loader).
//
// Which thread calls what (docs/device_stage.md): the runtime's current
// device is per thread and starts at 0, and the first call that needs a context opens one on the
// current device. So every call here is made by one of draftfeed's own threads after it made the
// rank's device current (make_device_current), never by the consumer's threads: a rank on GPU 3
// opens no context on GPU 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace draftfeed {

// A CUDA stream as the runtime knows it (cudaStream_t); null is the legacy default stream, torch's
// default stream.
using CudaStream = void*;

// A stream handle as Python holds it (torch's `Stream.cuda_stream` is an int).
inline CudaStream cuda_stream_from_handle(std::uintptr_t handle) {
  return reinterpret_cast<CudaStream>(handle);  // NOLINT(performance-no-int-to-ptr): it is one
}

// The entry points draftfeed uses, with the runtime's own signatures (opaque handles as void*).
struct CudaRuntime {
  int (*get_device_count)(int* count) = nullptr;
  int (*set_device)(int device) = nullptr;
  int (*get_device)(int* device) = nullptr;
  int (*host_register)(void* ptr, std::size_t size, unsigned int flags) = nullptr;
  int (*host_unregister)(void* ptr) = nullptr;
  int (*malloc_device)(void** ptr, std::size_t size) = nullptr;
  int (*free_device)(void* ptr) = nullptr;
  int (*stream_create)(void** stream, unsigned int flags) = nullptr;
  int (*stream_destroy)(void* stream) = nullptr;
  int (*event_create)(void** event, unsigned int flags) = nullptr;
  int (*event_destroy)(void* event) = nullptr;
  int (*event_record)(void* event, void* stream) = nullptr;
  int (*event_query)(void* event) = nullptr;
  int (*event_synchronize)(void* event) = nullptr;
  int (*stream_wait_event)(void* stream, void* event, unsigned int flags) = nullptr;
  int (*memcpy_async)(void* dst, const void* src, std::size_t bytes, int kind,
                      void* stream) = nullptr;
  const char* (*error_string)(int code) = nullptr;

  bool available = false;
  std::string detail;  // the library loaded, or why none could be
};

// The runtime, loaded once per process once found (thread-safe).
const CudaRuntime& cuda_runtime();

// The runtime's constants we pass (cuda_runtime_api.h).
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorNotReady = 600;
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr unsigned int kCudaStreamNonBlocking = 1;
inline constexpr unsigned int kCudaEventBlockingSync = 1;
inline constexpr unsigned int kCudaEventDisableTiming = 2;

// Throws Error(kRuntime) naming the call, the device and the runtime's text for `code`.
void check_cuda(int code, const char* call, int device);

// Makes `device` current on the calling thread (only if it is not already: setting a device
// opens its context). For draftfeed's own threads only.
void make_device_current(int device);

// The rank's device: `requested` when >= 0, else LOCAL_RANK (as torchrun sets it), else 0.
int resolve_cuda_device(int requested);

}  // namespace draftfeed
