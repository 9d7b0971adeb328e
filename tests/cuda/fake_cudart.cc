// A stand-in for the CUDA runtime (libcudart) on machines without a GPU, loaded by draftfeed
// through DRAFTFEED_CUDART. It is not a GPU: it models what makes page-locked memory and streams
// hazardous, so that tests can show draftfeed is safe there:
//   * queued work runs late and on another thread: every operation queued on a stream runs no
//     earlier than FAKE_CUDA_LATENCY_US (default 2000) after it was queued, in stream order, and
//     on a stream made by cudaStreamCreateWithFlags four times later (another engine, busier), so
//     work on two streams completes in another order than it was queued unless events order it; a
//     copy from page-locked memory reads its source only then (as a DMA engine does), a copy from
//     pageable memory reads it at the call (as the real runtime stages it);
//   * the consumer's streams may be slower still: FAKE_CUDA_CONSUMER_SLOWNESS (default 1)
//   multiplies
//     the latency of the legacy default stream and of streams a test's thread made (the trainer's),
//     as a GPU busy with the trainer's kernels for several steps would be; with it above 4 the
//     trainer's reads of a batch complete after the engine's next copy would land, unless a fence
//     orders them (docs/device_stage.md, "Each fence's test");
//   * events complete when their stream reaches them; a stream that waits for an event waits for
//     the record that was the event's latest at the time of the wait; queries and
//     synchronisations see the latest record;
//   * the current device is per thread and starts at 0; FAKE_CUDA_DEVICES (default 4) devices;
//     any call but cudaGetDevice/cudaGetDeviceCount/cudaGetErrorString opens a context on the
//     current device (cudaSetDevice on its target), as the runtime does;
//   * device memory is host memory (so tests can read what "the device" received once it ran).
// What it records: every call (FAKE_CUDA_LOG: one line each, with the thread, the current device
// and the stream), the devices with a context, the peak of device memory allocated, and
// violations: a page-locked region unregistered or device memory freed while queued work still
// reads it, an event and a stream of different devices, a stream used while another device is
// current. Test-only entry points start with fake_cuda_.
//
// Not modelled: the legacy default stream's implicit synchronisation with blocking streams (the
// engine creates its streams non-blocking), peer access, memory limits.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kInvalidDevice = 101;
constexpr int kNoDevice = 100;
constexpr int kInvalidResourceHandle = 400;
constexpr int kNotReady = 600;

struct Event {
  int device = 0;
  std::uint64_t recorded = 0;   // records queued so far
  std::uint64_t completed = 0;  // the latest record its stream reached
  bool destroyed = false;
};

struct Op {
  enum Kind { kCopy, kRecord, kWait } kind = kCopy;
  Clock::time_point due;
  std::uint8_t* dst = nullptr;
  const std::uint8_t* src = nullptr;
  std::size_t bytes = 0;
  std::shared_ptr<std::vector<std::uint8_t>> staged;  // a pageable source, read at the call
  Event* event = nullptr;
  std::uint64_t generation = 0;
};

struct Stream {
  int device = 0;
  int slowness = 1;  // latency multiple
  bool legacy = false;
  bool destroyed = false;
  std::deque<Op> ops;
};

struct Allocation {
  int device = 0;
  std::size_t bytes = 0;
  bool counted = true;  // in the live and peak figures
};

struct State {
  std::mutex mutex;
  std::condition_variable progressed;  // an operation ran
  std::condition_variable queued;      // an operation was queued (wakes the device thread)
  int devices = 4;
  std::chrono::microseconds latency{2000};
  int consumer_slowness = 1;                          // latency multiple of the trainer's streams
  std::map<std::string, std::uint64_t> engine_calls;  // by entry point, the engine's threads only
  FILE* log = nullptr;
  std::map<Stream*, std::unique_ptr<Stream>> streams;
  std::map<int, Stream*> legacy;  // per device
  std::map<Event*, std::unique_ptr<Event>> events;
  std::map<std::uintptr_t, Allocation> device_memory;
  std::map<std::uintptr_t, std::size_t> registered;
  std::set<int> contexts;
  std::vector<std::string> violations;
  std::size_t live_device_bytes = 0;
  std::size_t peak_device_bytes = 0;
  std::uint64_t copies = 0;
  bool device_thread = false;
  std::deque<std::vector<std::uint8_t>> scratch;  // where copies into freed memory land

  State() {
    if (const char* n = std::getenv("FAKE_CUDA_DEVICES")) devices = std::atoi(n);
    if (const char* us = std::getenv("FAKE_CUDA_LATENCY_US")) {
      latency = std::chrono::microseconds(std::atoll(us));
    }
    if (const char* n = std::getenv("FAKE_CUDA_CONSUMER_SLOWNESS"); n != nullptr && *n != '\0') {
      consumer_slowness = std::max(1, std::atoi(n));
    }
    if (const char* path = std::getenv("FAKE_CUDA_LOG"); path != nullptr && *path != '\0') {
      log = std::fopen(path, "a");
    }
  }
};

State& state() {
  static State* s = new State;  // never destroyed: the device thread may outlive static teardown
  return *s;
}

thread_local int t_current = 0;
thread_local bool t_test_thread = false;  // fake_cuda_mark_test_thread()

unsigned long thread_number() {
  static std::atomic<unsigned long> next{1};
  thread_local unsigned long mine = next++;
  return mine;
}

// With the mutex held: the call opens a context on the current device, and is logged. A test's
// own thread (playing the trainer) is logged as by=test and its contexts are not counted.
void note_call(State& s, const char* call, std::uintptr_t stream = 0, const char* extra = "") {
  if (!t_test_thread) {
    s.contexts.insert(t_current);
    ++s.engine_calls[call];
  }
  if (s.log != nullptr) {
    std::fprintf(s.log, "call=%s thread=%lu device=%d stream=%#llx by=%s %s\n", call,
                 thread_number(), t_current, static_cast<unsigned long long>(stream),
                 t_test_thread ? "test" : "engine", extra);
    std::fflush(s.log);
  }
}

void violation(State& s, const std::string& what) {
  s.violations.push_back(what);
  if (s.log != nullptr) {
    std::fprintf(s.log, "violation thread=%lu device=%d %s\n", thread_number(), t_current,
                 what.c_str());
    std::fflush(s.log);
  }
}

bool overlaps(const std::uint8_t* a, std::size_t an, std::uintptr_t b, std::size_t bn) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  return a0 < b + bn && b < a0 + an;
}

// Whether queued copies still read or write [begin, begin + bytes), which is about to be
// unregistered or freed. They are detached from it (their source read now, their destination
// made scratch), so the test sees the violation instead of a crash when the memory goes.
bool detach_pending_ops(State& s, std::uintptr_t begin, std::size_t bytes) {
  bool touched = false;
  for (const auto& [key, stream] : s.streams) {
    for (Op& op : stream->ops) {
      if (op.kind != Op::kCopy) continue;
      if (!op.staged && overlaps(op.src, op.bytes, begin, bytes)) {
        op.staged = std::make_shared<std::vector<std::uint8_t>>(op.src, op.src + op.bytes);
        touched = true;
      }
      if (overlaps(op.dst, op.bytes, begin, bytes)) {
        s.scratch.emplace_back(op.bytes);
        op.dst = s.scratch.back().data();
        touched = true;
      }
    }
  }
  return touched;
}

// The device thread: runs every stream's head operation once it is due and runnable.
void run_device(State& s) {
  std::unique_lock lock(s.mutex);
  for (;;) {
    const auto now = Clock::now();
    Clock::time_point earliest = Clock::time_point::max();
    bool ran = false;
    for (auto& [key, stream] : s.streams) {
      while (!stream->ops.empty()) {
        Op& op = stream->ops.front();
        if (op.due > now) {
          earliest = std::min(earliest, op.due);
          break;
        }
        if (op.kind == Op::kWait && op.event->completed < op.generation) break;
        if (op.kind == Op::kCopy) {
          std::memcpy(op.dst, op.staged ? op.staged->data() : op.src, op.bytes);
        } else if (op.kind == Op::kRecord) {
          op.event->completed = std::max(op.event->completed, op.generation);
        }
        stream->ops.pop_front();
        ran = true;
      }
    }
    if (ran) {
      s.progressed.notify_all();
      continue;
    }
    if (earliest == Clock::time_point::max()) {
      s.queued.wait(lock);
    } else {
      s.queued.wait_until(lock, earliest);
    }
  }
}

void enqueue(State& s, Stream* stream, Op op) {
  op.due = Clock::now() + s.latency * stream->slowness;
  stream->ops.push_back(std::move(op));
  if (!s.device_thread) {
    s.device_thread = true;
    std::thread([&s] { run_device(s); }).detach();
  }
  s.queued.notify_all();
}

// The stream a handle names (0: the current device's legacy stream), or null.
Stream* stream_of(State& s, void* handle) {
  if (handle == nullptr) {
    Stream*& legacy = s.legacy[t_current];
    if (legacy == nullptr) {
      auto stream = std::make_unique<Stream>();
      stream->device = t_current;
      stream->legacy = true;
      stream->slowness = s.consumer_slowness;  // the trainer's stream (the engine makes its own)
      legacy = stream.get();
      s.streams[legacy] = std::move(stream);
    }
    return legacy;
  }
  auto found = s.streams.find(static_cast<Stream*>(handle));
  return found == s.streams.end() || found->second->destroyed ? nullptr : found->second.get();
}

Event* event_of(State& s, void* handle) {
  auto found = s.events.find(static_cast<Event*>(handle));
  return found == s.events.end() || found->second->destroyed ? nullptr : found->second.get();
}

void check_stream_device(State& s, const char* call, const Stream* stream) {
  if (stream->device != t_current) {
    violation(s, std::string(call) + ": a stream of cuda:" + std::to_string(stream->device) +
                     " used with cuda:" + std::to_string(t_current) + " current");
  }
}

const Allocation* device_allocation(State& s, const void* ptr, std::size_t bytes) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = s.device_memory.upper_bound(p);
  if (it == s.device_memory.begin()) return nullptr;
  --it;
  if (p + bytes > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

bool registered_host(State& s, const void* ptr, std::size_t bytes) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = s.registered.upper_bound(p);
  if (it == s.registered.begin()) return false;
  --it;
  return p + bytes <= it->first + it->second;
}

}  // namespace

extern "C" {

int cudaGetDeviceCount(int* count) {
  *count = state().devices;
  return state().devices == 0 ? kNoDevice : kSuccess;
}

int cudaGetDevice(int* device) {
  // As the real runtime where it sees no device (FAKE_CUDA_DEVICES=0): every call fails.
  if (state().devices == 0) return kNoDevice;
  *device = t_current;
  return kSuccess;
}

int cudaSetDevice(int device) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (device < 0 || device >= s.devices) return kInvalidDevice;
  t_current = device;
  note_call(s, "cudaSetDevice");
  return kSuccess;
}

const char* cudaGetErrorString(int code) {
  switch (code) {
    case kSuccess:
      return "no error";
    case kInvalidValue:
      return "invalid argument";
    case kInvalidDevice:
      return "invalid device ordinal";
    case kInvalidResourceHandle:
      return "invalid resource handle";
    case kNotReady:
      return "device not ready";
    default:
      return "unknown error";
  }
}

int cudaGetLastError() { return kSuccess; }

int cudaHostRegister(void* ptr, std::size_t bytes, unsigned int /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  char extra[64];
  std::snprintf(extra, sizeof(extra), "ptr=%p bytes=%zu", ptr, bytes);
  note_call(s, "cudaHostRegister", 0, extra);
  s.registered[reinterpret_cast<std::uintptr_t>(ptr)] = bytes;
  return kSuccess;
}

int cudaHostUnregister(void* ptr) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  char extra[32];
  std::snprintf(extra, sizeof(extra), "ptr=%p", ptr);
  note_call(s, "cudaHostUnregister", 0, extra);
  auto found = s.registered.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (found == s.registered.end()) return kInvalidValue;
  if (detach_pending_ops(s, found->first, found->second)) {
    violation(s, "cudaHostUnregister: a queued copy still reads the region");
  }
  s.registered.erase(found);
  return kSuccess;
}

int cudaMalloc(void** ptr, std::size_t bytes) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaMalloc");
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  void* memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return 2;  // cudaErrorMemoryAllocation
  s.device_memory[reinterpret_cast<std::uintptr_t>(memory)] = {t_current, rounded, !t_test_thread};
  if (!t_test_thread) {
    s.live_device_bytes += rounded;
    s.peak_device_bytes = std::max(s.peak_device_bytes, s.live_device_bytes);
  }
  *ptr = memory;
  return kSuccess;
}

int cudaFree(void* ptr) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaFree");
  auto found = s.device_memory.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (found == s.device_memory.end()) return kInvalidValue;
  if (detach_pending_ops(s, found->first, found->second.bytes)) {
    violation(s, "cudaFree: queued work still uses the memory");
  }
  if (found->second.counted) s.live_device_bytes -= found->second.bytes;
  s.device_memory.erase(found);
  std::free(ptr);
  return kSuccess;
}

int cudaStreamCreateWithFlags(void** stream, unsigned int /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaStreamCreateWithFlags");
  auto created = std::make_unique<Stream>();
  created->device = t_current;
  created->slowness = t_test_thread ? 4 * s.consumer_slowness : 4;
  *stream = created.get();
  s.streams[created.get()] = std::move(created);
  return kSuccess;
}

int cudaStreamDestroy(void* stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaStreamDestroy", reinterpret_cast<std::uintptr_t>(stream));
  Stream* found = stream_of(s, stream);
  if (found == nullptr || found->legacy) return kInvalidResourceHandle;
  found->destroyed = true;  // its queued work still runs
  return kSuccess;
}

int cudaEventCreateWithFlags(void** event, unsigned int /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaEventCreateWithFlags");
  auto created = std::make_unique<Event>();
  created->device = t_current;
  *event = created.get();
  s.events[created.get()] = std::move(created);
  return kSuccess;
}

int cudaEventDestroy(void* event) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaEventDestroy");
  Event* found = event_of(s, event);
  if (found == nullptr) return kInvalidResourceHandle;
  found->destroyed = true;  // queued records and waits still see it
  return kSuccess;
}

int cudaEventRecord(void* event, void* stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaEventRecord", reinterpret_cast<std::uintptr_t>(stream));
  Event* e = event_of(s, event);
  Stream* st = stream_of(s, stream);
  if (e == nullptr || st == nullptr) return kInvalidResourceHandle;
  check_stream_device(s, "cudaEventRecord", st);
  if (e->device != st->device) {
    violation(s, "cudaEventRecord: an event of cuda:" + std::to_string(e->device) +
                     " on a stream of cuda:" + std::to_string(st->device));
    return kInvalidResourceHandle;
  }
  Op op;
  op.kind = Op::kRecord;
  op.event = e;
  op.generation = ++e->recorded;
  enqueue(s, st, std::move(op));
  return kSuccess;
}

int cudaEventQuery(void* event) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaEventQuery");
  Event* e = event_of(s, event);
  if (e == nullptr) return kInvalidResourceHandle;
  return e->completed >= e->recorded ? kSuccess : kNotReady;
}

int cudaEventSynchronize(void* event) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  note_call(s, "cudaEventSynchronize");
  Event* e = event_of(s, event);
  if (e == nullptr) return kInvalidResourceHandle;
  const std::uint64_t target = e->recorded;
  s.progressed.wait(lock, [&] { return e->completed >= target; });
  return kSuccess;
}

int cudaStreamWaitEvent(void* stream, void* event, unsigned int /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  note_call(s, "cudaStreamWaitEvent", reinterpret_cast<std::uintptr_t>(stream));
  Event* e = event_of(s, event);
  Stream* st = stream_of(s, stream);
  if (e == nullptr || st == nullptr) return kInvalidResourceHandle;
  check_stream_device(s, "cudaStreamWaitEvent", st);
  if (e->recorded == 0) return kSuccess;
  Op op;
  op.kind = Op::kWait;
  op.event = e;
  op.generation = e->recorded;
  enqueue(s, st, std::move(op));
  return kSuccess;
}

int cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, int kind, void* stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  char extra[64];
  std::snprintf(extra, sizeof(extra), "kind=%d bytes=%zu", kind, bytes);
  note_call(s, "cudaMemcpyAsync", reinterpret_cast<std::uintptr_t>(stream), extra);
  Stream* st = stream_of(s, stream);
  if (st == nullptr) return kInvalidResourceHandle;
  check_stream_device(s, "cudaMemcpyAsync", st);
  const bool dst_device = device_allocation(s, dst, bytes) != nullptr;
  const bool src_device = device_allocation(s, src, bytes) != nullptr;
  // 1 host->device, 2 device->host, 3 device->device, 4 inferred.
  if ((kind == 1 && (!dst_device || src_device)) || (kind == 2 && (dst_device || !src_device)) ||
      (kind == 3 && (!dst_device || !src_device))) {
    violation(s, "cudaMemcpyAsync: the pointers do not fit kind " + std::to_string(kind));
    return kInvalidValue;
  }
  Op op;
  op.kind = Op::kCopy;
  op.dst = static_cast<std::uint8_t*>(dst);
  op.src = static_cast<const std::uint8_t*>(src);
  op.bytes = bytes;
  if (!src_device && !registered_host(s, src, bytes)) {
    // Pageable memory: the runtime stages it before returning.
    op.staged = std::make_shared<std::vector<std::uint8_t>>(op.src, op.src + bytes);
  }
  ++s.copies;
  enqueue(s, st, std::move(op));
  return kSuccess;
}

int cudaStreamSynchronize(void* stream) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  note_call(s, "cudaStreamSynchronize", reinterpret_cast<std::uintptr_t>(stream));
  Stream* st = stream_of(s, stream);
  if (st == nullptr) return kInvalidResourceHandle;
  s.progressed.wait(lock, [&] { return st->ops.empty(); });
  return kSuccess;
}

int cudaDeviceSynchronize() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  note_call(s, "cudaDeviceSynchronize");
  const int device = t_current;
  s.progressed.wait(lock, [&] {
    return std::all_of(s.streams.begin(), s.streams.end(), [&](const auto& entry) {
      return entry.second->device != device || entry.second->ops.empty();
    });
  });
  return kSuccess;
}

// ---- for tests only ----

// Bit d set: a context was opened on device d (by a thread other than the test's).
unsigned long long fake_cuda_contexts() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  unsigned long long mask = 0;
  for (int d : s.contexts) mask |= 1ULL << d;
  return mask;
}

// The violations so far, one per line, into `out` (truncated to `size`); returns their count.
int fake_cuda_violations(char* out, std::size_t size) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::string text;
  for (const std::string& v : s.violations) text += v + "\n";
  if (out != nullptr && size > 0) {
    std::snprintf(out, size, "%s", text.c_str());
  }
  return static_cast<int>(s.violations.size());
}

// Device memory allocated (and counted) at most at once, and now.
unsigned long long fake_cuda_peak_device_bytes() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.peak_device_bytes;
}

unsigned long long fake_cuda_live_device_bytes() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.live_device_bytes;
}

unsigned long long fake_cuda_copies() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.copies;
}

// How many times the engine's threads (not the test's) called `name` (say "cudaFree").
unsigned long long fake_cuda_engine_calls(const char* name) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto found = s.engine_calls.find(name);
  return found == s.engine_calls.end() ? 0 : found->second;
}

// The calling thread is the test's (it plays the trainer): its calls are logged as by=test, open
// no context in fake_cuda_contexts(), and its device memory is not in the live and peak figures.
void fake_cuda_mark_test_thread() { t_test_thread = true; }

void fake_cuda_set_latency_us(long long microseconds) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.latency = std::chrono::microseconds(microseconds);
}

}  // extern "C"
