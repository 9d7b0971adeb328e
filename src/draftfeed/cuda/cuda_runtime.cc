#include "draftfeed/cuda/cuda_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

// The runtimes' names, newest first (the soname a toolkit's or torch's libcudart carries).
constexpr const char* kRuntimeNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                         "libcudart.so"};

// The first of `names` that loads (with `flags`) and has every entry point, bound into `out`;
// `tried` collects those that load but lack one.
bool load_first(const std::vector<const char*>& names, int flags, const char* how, CudaRuntime& out,
                std::string& tried) {
  for (const char* name : names) {
    if (name == nullptr || *name == '\0') continue;
    void* handle = ::dlopen(name, flags);
    if (handle == nullptr) continue;
    CudaRuntime bound;
    if (bind_all(handle, bound)) {
      bound.available = true;
      bound.detail = std::string("CUDA runtime ") + name + " " + how;
      out = std::move(bound);
      return true;
    }
    tried += std::string(tried.empty() ? "" : ", ") + name;
  }
  return false;
}

// DRAFTFEED_CUDART when set; else a runtime already in the process (torch's, loaded with torch:
// one runtime, one set of contexts and streams with the trainer's); else the library search path.
CudaRuntime load_runtime() {
  CudaRuntime result;
  std::string tried;
  const char* configured = std::getenv("DRAFTFEED_CUDART");
  if (configured != nullptr && *configured != '\0') {
    if (load_first({configured}, RTLD_NOW | RTLD_LOCAL, "loaded (DRAFTFEED_CUDART)", result,
                   tried)) {
      return result;
    }
  } else {
    const std::vector<const char*> names(std::begin(kRuntimeNames), std::end(kRuntimeNames));
    if (load_first(names, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded in the process",
                   result, tried) ||
        load_first(names, RTLD_NOW | RTLD_LOCAL, "loaded from the library path", result, tried)) {
      return result;
    }
  }
  result.detail = tried.empty()
                      ? std::string("no CUDA runtime found") +
                            (configured != nullptr && *configured != '\0'
                                 ? std::string(" (DRAFTFEED_CUDART=") + configured + ")"
                                 : " (none loaded in the process, e.g. by torch, nor on the "
                                   "library path)") +
                            ": batches use ordinary (pageable) memory"
                      : "no usable CUDA runtime (" + tried +
                            " lack an entry point draftfeed calls): batches use ordinary memory";
  return result;
}

}  // namespace

const CudaRuntime& cuda_runtime() {
  // Found once and kept; not found, looked for again at the next call (a loader made before
  // `import torch` loaded torch's runtime finds it later). A runtime never unloads: the pointer
  // handed out stays valid.
  static std::mutex mutex;
  static std::atomic<const CudaRuntime*> found{nullptr};
  if (const CudaRuntime* runtime = found.load(std::memory_order_acquire)) return *runtime;
  std::lock_guard lock(mutex);
  if (const CudaRuntime* runtime = found.load(std::memory_order_acquire)) return *runtime;
  CudaRuntime loaded = load_runtime();
  if (loaded.available) {
    const CudaRuntime* runtime = new CudaRuntime(std::move(loaded));  // never freed: see above
    found.store(runtime, std::memory_order_release);
    return *runtime;
  }
  // Each failure's answer stays valid for whoever holds it; a new one is kept only when it says
  // something else (so this grows by the distinct reasons, not by the calls).
  static std::vector<std::unique_ptr<CudaRuntime>> failures;
  if (failures.empty() || failures.back()->detail != loaded.detail) {
    failures.push_back(std::make_unique<CudaRuntime>(std::move(loaded)));
  }
  return *failures.back();
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
