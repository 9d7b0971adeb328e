// A thread of draftfeed's own, with the rank's device current, that makes the CUDA calls a
// consumer's thread would otherwise make: recording that a released batch's memory may still be
// read by the consumer's stream, making the consumer's stream wait for a batch's copy, freeing
// page-locked or device memory once the device is done with it.
//
// Why a thread: the consumer's threads (the trainer's loop, the garbage collector dropping a
// tensor) may have any device current, or none yet; a CUDA call there would open a context on
// that device (GPU 0 for a thread that never chose one). Here every call runs where the rank's
// device was made current once (docs/device_stage.md).
//
// Lifetime: shared by whatever may still post to it (buffers, fences, events); the thread ends
// when the last owner is gone and its queue, including frees still waiting for the device, is
// done. Thread safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace draftfeed {

class DeviceWorker {
 public:
  // Starts the thread and makes `device` current on it. nullptr, with the reason in `why`, when
  // there is no CUDA runtime or the device cannot be made current (no GPU, a bad index).
  static std::shared_ptr<DeviceWorker> start(int device, std::string* why);
  // The process's worker for `device`, started if none is alive (loaders and packed batches of
  // one rank share it); nullptr as start().
  static std::shared_ptr<DeviceWorker> for_device(int device, std::string* why);
  ~DeviceWorker();
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  int device() const { return device_; }
  bool on_worker_thread() const;

  // Runs `task` on the worker, after every task posted before it. Exceptions are the task's to
  // handle (one that escapes is dropped: post what can record its own failure).
  void post(std::function<void()> task);
  // Runs `task` on the worker and waits for it; rethrows what it threw. Inline on the worker.
  void run(const std::function<void()>& task);
  // Runs `task` once `ready()` is true; the worker asks again about every half millisecond while
  // any such task waits (a free that must wait for the device's reads). `ready` runs on the worker.
  void post_when(std::function<bool()> ready, std::function<void()> task);
  // Blocks until every task posted so far, including those waiting to be ready, has run (a
  // loader going away leaves no page-locked memory behind). Not on the worker itself.
  void settle();

 private:
  struct State;
  explicit DeviceWorker(int device);
  static void loop(const std::shared_ptr<State>& state);

  const int device_;
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive this object
  std::thread::id thread_id_;
};

}  // namespace draftfeed
