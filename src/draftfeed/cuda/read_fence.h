// The device's reads of one buffer that may still be pending: for each stream that may read it,
// an event recorded after those reads were queued. A buffer is rewritten or freed only once they
// are complete (wait, passed) or, for a device buffer rewritten by a copy of our own, once that
// copy's stream waits for them on the device (order_after).
//
// Why events: a copy from page-locked memory (`tensor.to("cuda", non_blocking=True)`) only queues
// the copy; the device does it when its stream gets there, maybe steps later if the trainer's
// CPU runs ahead. torch's own pinned allocator records such an event per copy; memory that
// draftfeed page-locks is outside it, so draftfeed records one when a batch is released: every
// copy the consumer made from it was queued on the consumer's stream before that.
//
// One event per stream, recorded again at each release: a later record covers everything an
// earlier one did. Thread safety: mark_reads_on from any thread; the rest from draftfeed's own
// threads with the device current (the worker, the scheduler, the device stage's copier).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "draftfeed/cuda/cuda_runtime.h"
#include "draftfeed/cuda/device_worker.h"

namespace draftfeed {

class ReadFence : public std::enable_shared_from_this<ReadFence> {
 public:
  static std::shared_ptr<ReadFence> create(std::shared_ptr<DeviceWorker> worker);
  ~ReadFence();
  ReadFence(const ReadFence&) = delete;
  ReadFence& operator=(const ReadFence&) = delete;

  // Every read queued on `stream` until now; the worker records the event (in post order).
  void mark_reads_on(CudaStream stream);
  // The same, recorded by the calling thread now (draftfeed's own, with the device current).
  void mark_reads_on_now(CudaStream stream);

  // True when no marked read is pending (no CUDA call when none was marked since the last check).
  bool passed();
  // Blocks until every marked read is complete. Throws if a mark could not be recorded.
  void wait();
  // Makes `stream` wait, on the device, for every marked read on other streams (nothing blocks
  // here).
  void order_after(CudaStream stream);

  const std::shared_ptr<DeviceWorker>& worker() const { return worker_; }

  // Process-wide: how often memory was about to be rewritten (wait, order_after) or freed
  // (passed() false before it) while a marked read was still pending on the device, i.e. how
  // often a fence had something to do. A GPU test that sees 0 tested nothing.
  struct Counts {
    std::uint64_t rewrites_while_read = 0;
    std::uint64_t checks_while_read = 0;
  };
  static Counts counts();

 private:
  explicit ReadFence(std::shared_ptr<DeviceWorker> worker) : worker_(std::move(worker)) {}
  struct Mark {
    CudaStream stream = nullptr;
    void* event = nullptr;
    bool pending = false;     // recorded, not yet seen complete
    unsigned generation = 0;  // records so far: a wait clears `pending` only for its own
  };
  void record_locked(CudaStream stream);  // with mutex_ held, on a thread with the device current
  void wait_posted(std::unique_lock<std::mutex>& lock);  // until the worker recorded every post

  const std::shared_ptr<DeviceWorker> worker_;
  std::mutex mutex_;
  std::condition_variable recorded_;
  int posted_ = 0;  // marks posted to the worker, not yet recorded
  std::vector<Mark> marks_;
  std::string error_;  // a record that failed: the reads it stood for cannot be waited for
};

}  // namespace draftfeed
