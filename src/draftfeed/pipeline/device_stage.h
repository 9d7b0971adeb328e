// The device stage: each assembled batch copied from its page-locked buffer to device memory on a
// stream of draftfeed's own, ahead of the consumer, so the copy overlaps the trainer's compute
// (docs/device_stage.md).
//
//   copier thread: takes the pipeline's batches in delivery order; for each takes a free device
//                  buffer (a small pool: `buffers`, default 2, allocated when an epoch starts and
//                  freed once its batches are gone, so a training and a validation loader do not
//                  hold device memory at the same time; an epoch that starts while the consumer
//                  holds batches of the last one keeps its buffers), makes the copy stream wait on
//                  the device for the consumer's reads of that buffer, queues one copy per tensor,
//                  records the copy's event, marks the host buffer as read by the copy stream (the
//                  pool rewrites it only after the copy) and lets the host batch go;
//   next():        hands the consumer the oldest copied batch after making the consumer's stream
//                  wait, on the device, for its copy (the device worker queues the wait); the
//                  consumer's reads of it are marked on that stream when it is released.
// The consumer's thread makes no CUDA call: its waits and marks run on the device worker.
// Delivery order and the batches are the pipeline's; only the memory they are in changes.
// Thread safety: `next` for one consumer thread; `begin_stop` from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/cuda/device_allocator.h"
#include "draftfeed/cuda/device_worker.h"
#include "draftfeed/pipeline/buffer_pool.h"
#include "draftfeed/pipeline/pipeline.h"

namespace draftfeed {

class DeviceStage {
 public:
  // Device batches of `layout` on the worker's device, `buffers` of them during an epoch.
  DeviceStage(std::shared_ptr<const BatchLayout> layout, std::shared_ptr<DeviceWorker> worker,
              int buffers);
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // Where the device buffers' memory comes from (default: the CUDA runtime's cudaMalloc); buffers
  // made from the next start() on take it there. From the thread that calls start().
  void set_allocator(std::shared_ptr<DeviceAllocator> allocator);

  // Where the stage takes its batches from: the pipeline's next(reader stream).
  using Upstream = std::function<std::shared_ptr<BatchLease>(CudaStream)>;
  // Starts copying what `upstream` hands out until it returns null (the end of the epoch).
  void start(Upstream upstream);
  // The next batch, in device memory, or null at the end; rethrows the copier's or upstream's
  // error. `consumer`: the stream the consumer uses the batch on (0: the default stream).
  std::shared_ptr<BatchLease> next(CudaStream consumer);
  // Stopping: begin_stop() (the copier ends at its next wait), then stop the upstream (a copier
  // waiting there gets null), then join(), which also drops copied batches not handed out.
  void begin_stop();
  void join();

  // The consumer-facing counts (batches handed out, their wait) and the device pool's figures.
  void fill_metrics(PipelineMetrics& metrics) const;

 private:
  void run_copier(const Upstream& upstream, const std::shared_ptr<BufferPool>& pool);
  std::shared_ptr<BatchLease> copy_to_device(const std::shared_ptr<BatchLease>& host,
                                             BufferPool& pool);
  void poke_pool() const;

  const std::shared_ptr<const BatchLayout> layout_;
  const std::shared_ptr<DeviceWorker> worker_;
  const int buffers_;
  CudaStream copy_stream_ = nullptr;  // non-blocking
  std::shared_ptr<DeviceAllocator> allocator_ = runtime_device_allocator();
  // Device memory the stage's buffers hold now (alive while any batch in them is), and at most.
  const std::shared_ptr<std::atomic<std::size_t>> device_bytes_ =
      std::make_shared<std::atomic<std::size_t>>(0);
  const std::shared_ptr<std::atomic<std::size_t>> peak_device_bytes_ =
      std::make_shared<std::atomic<std::size_t>>(0);

  std::thread copier_;
  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::shared_ptr<BufferPool> pool_;         // the epoch's device buffers; null between epochs
  std::weak_ptr<BufferPool> previous_pool_;  // alive while the consumer holds its batches
  bool had_pool_ = false;
  std::deque<std::shared_ptr<BatchLease>> ready_;
  bool stopping_ = false;
  bool finished_ = false;  // upstream said the epoch is over
  bool consumer_waiting_ = false;
  std::exception_ptr error_;
  PipelineMetrics counts_;  // the consumer-facing ones only
  double start_time_ = 0;
};

}  // namespace draftfeed
