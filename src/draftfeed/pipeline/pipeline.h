// The pipeline: batches of an epoch fetched and assembled by a thread pool into a fixed pool of
// buffers, delivered in plan order or as they become ready.
//
//   scheduler thread: walks the epoch's batches in order; for each takes a free buffer
//   (back-pressure)
//                     and queues one fetch task per sample;
//   fetch tasks:      ask the SampleSource for the row (cache file or server), in parallel, so a
//   slow
//                     sample does not hold its batch's other samples;
//   last fetch:       places the usable samples (reference packing) and queues copy chunks;
//   copy chunks:      the one fused copy (cast, noise, finiteness) of a slice of a sample's rows;
//   last chunk:       integer tensors, document ids, zero tails; the batch is ready.
// Tasks carry their batch's sequence number as priority, so the oldest batch finishes first.
// A fatal error (a source that throws, `on_missing=raise`, a fatal generation failure unless
// `fatal_failures_in_batch`) stops the epoch and is rethrown by `next()`. Thread safety: `start`,
// `next` and `metrics` are for one consumer thread, `stop` may come from any thread; the pipeline's
// own threads never call back into the consumer.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/common/stats_tree.h"
#include "draftfeed/common/thread_pool.h"
#include "draftfeed/cuda/cuda_event.h"
#include "draftfeed/cuda/cuda_runtime.h"
#include "draftfeed/cuda/device_worker.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/pipeline/buffer_pool.h"
#include "draftfeed/pipeline/host_memory.h"
#include "draftfeed/read_ahead/byte_budget.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

struct PipelineOptions {
  int num_threads = 2;   // fetch + assembly threads (plus the source's blocking_fetches())
  int buffers = 4;       // batch buffers (batches in flight or waiting; Python: prefetch)
  bool in_order = true;  // deliver in plan order, or as batches become ready
  bool try_pin = true;   // page-lock buffers when a CUDA runtime is present
  // The rank's CUDA device, current for every CUDA call draftfeed makes (pinning, the device
  // stage); -1: LOCAL_RANK, else 0 (cuda/cuda_runtime.h resolve_cuda_device).
  int cuda_device = -1;
  // The device stage (Loader): batches delivered in device memory of cuda_device, `device_buffers`
  // of them at most (being copied, waiting, or held by the consumer). Pins the host buffers.
  bool device_stage = false;
  int device_buffers = 2;
  std::int64_t chunk_bytes = 4 << 20;  // bytes of hidden states per copy task
  int max_drop_examples = 8;           // drop messages kept per batch
  // A fatal generation failure (online: too many rows failed in a row, fail_on_hidden_state_error)
  // marks its batch (BatchLease::fatal) instead of ending the epoch, as the reference's recovery
  // metadata does: the trainer then stops every rank together at its next synchronisation. Other
  // fatal outcomes (on_missing=raise, a source that throws) still end the epoch.
  bool fatal_failures_in_batch = false;

  // The only check of these fields (Error kInvalidArgument naming the field).
  void validate() const;
};

using DropCounts = std::array<std::int64_t, static_cast<std::size_t>(DropReason::kCount)>;

// A delivered batch. Holding it keeps its buffer out of the pool, and its layout alive (a batch
// kept after its pipeline is gone still knows where its tensors are).
class BatchLease {
 public:
  std::shared_ptr<const BatchLayout> layout;
  BatchMemory memory;  // where each tensor is (layout order)
  // What keeps each tensor's memory: a consumer's view holds its region, not the whole batch.
  std::vector<std::shared_ptr<SlotRegion>> regions;
  std::int64_t index = 0;  // position in the epoch's full plan
  std::int64_t planned_samples = 0;
  std::int64_t used_samples = 0;   // samples with rows in the batch
  std::int64_t tokens = 0;         // rows holding data
  bool locally_empty = false;      // every sample failed: the reference's all-padding batch
  std::int64_t failure_count = 0;  // drops that count as generation failures (online)
  bool fatal = false;              // a fatal generation failure (fatal_failures_in_batch)
  std::string fatal_message;       // the first fatal failure's message
  DropCounts dropped{};
  struct Drop {
    DropReason reason;
    std::string message;
  };
  std::vector<Drop> drop_messages;  // the first max_drop_examples drops, for the logs

  // Where each usable sample's rows are (Preprocess::kCustom: each sample unpacked, for the
  // callable), and the batch's planned rows (placement.samples[k].sample indexes them).
  BatchPlacement placement;
  std::vector<std::int64_t> rows;

  std::unique_ptr<BufferPool::Handle> buffer;  // null for a batch in a buffer of its own

  // The CUDA device whose memory `memory` is (the device stage's batches); -1: host memory.
  int device = -1;
  // Device batches: the copy that filled them (the consumer's stream waits for it).
  std::shared_ptr<CudaEvent> ready_event;
};

struct PipelineMetrics {
  std::int64_t batches = 0;
  std::int64_t tokens = 0;
  std::int64_t hidden_bytes = 0;     // bytes of hidden-state rows delivered (data rows only)
  std::int64_t batch_bytes = 0;      // whole buffers delivered
  double consumer_wait_seconds = 0;  // time `next()` spent waiting
  double first_batch_seconds = -1;   // from `start` to the first batch of the latest epoch
  double elapsed_seconds = 0;        // since `start` of the latest epoch
  int ready = 0;                     // batches assembled, not yet taken
  int in_flight = 0;                 // batches being fetched or assembled
  int buffers = 0;
  int extra_buffers = 0;
  std::size_t held_slot_bytes = 0;  // slots allocated apart while a consumer kept earlier tensors
  bool pinned = false;
  std::size_t buffer_bytes = 0;
  DropCounts dropped{};
  // The device stage (absent: device -1): its buffers in device memory (device_buffers during an
  // epoch, plus any a consumer keeping whole batches forced), their bytes each, slots allocated
  // apart for kept tensors, and the device memory it holds now and held at most.
  int device = -1;
  int device_buffers = 0;
  int device_extra_buffers = 0;
  std::size_t device_buffer_bytes = 0;
  std::size_t device_held_slot_bytes = 0;
  std::size_t device_bytes = 0;
  std::size_t device_peak_bytes = 0;
  // What the source reports (SampleSource::stats_report: a cache's file read-ahead, an online
  // source's requests and lookahead), filled by the Loader; and what its read-ahead holds ahead,
  // the one figure of read-ahead memory (SampleSource::read_ahead_memory).
  StatsTree source;
  ReadAheadMemory read_ahead_memory;
};

// Each statistic under its reported name (common/stats_tree.h): the Python metrics() dict and the
// command line's report are made from this list; the source's groups follow at the top level.
template <typename Visit>
void for_each_stat(const PipelineMetrics& m, Visit&& visit) {
  visit("batches", m.batches);
  visit("tokens", m.tokens);
  visit("hidden_bytes", m.hidden_bytes);
  visit("batch_bytes", m.batch_bytes);
  visit("consumer_wait_seconds", m.consumer_wait_seconds);
  visit("first_batch_seconds", m.first_batch_seconds);
  visit("elapsed_seconds", m.elapsed_seconds);
  visit("ready", m.ready);
  visit("in_flight", m.in_flight);
  visit("buffers", m.buffers);
  visit("extra_buffers", m.extra_buffers);
  visit("held_slot_bytes", m.held_slot_bytes);
  visit("pinned", m.pinned);
  visit("buffer_bytes", m.buffer_bytes);
  visit("device", m.device);
  visit("device_buffers", m.device_buffers);
  visit("device_extra_buffers", m.device_extra_buffers);
  visit("device_buffer_bytes", m.device_buffer_bytes);
  visit("device_held_slot_bytes", m.device_held_slot_bytes);
  visit("device_bytes", m.device_bytes);
  visit("device_peak_bytes", m.device_peak_bytes);
  visit("dropped", named_counts(m.dropped, drop_reason_name));
  visit("read_ahead_memory", m.read_ahead_memory);
  for (const StatsTree::Group& group : m.source.groups) visit(group.name.c_str(), group.tree);
}

// Where each tensor of a batch lies in its buffer (the layout's slots).
std::vector<SlotSpan> batch_slot_spans(const BatchLayout& layout);

// Adds one batch handed to the consumer to the consumer-facing counts (batches, tokens, bytes,
// drops, first batch).
void count_delivered(PipelineMetrics& metrics, const BatchLease& lease, double since_start);

class Pipeline {
 public:
  Pipeline(BatchLayout layout, std::shared_ptr<const TokenDataset> dataset,
           std::shared_ptr<SampleSource> source, PipelineOptions options);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Starts delivering `batches` (stopping any epoch in progress). `epoch` keys the noise. The plan
  // is the caller's to tell the source (SampleSource::will_need): the pipeline only schedules.
  void start(std::uint64_t epoch, std::vector<PlannedBatch> batches);
  void start(std::uint64_t epoch, std::shared_ptr<const std::vector<PlannedBatch>> batches);
  // The next batch, or nullptr when the epoch is done. Rethrows a fatal error from the workers.
  // `reader` is the CUDA stream the consumer will queue its copies of the batch on: when the
  // memory is page-locked, its reads are marked there when the batch is released.
  std::shared_ptr<BatchLease> next(CudaStream reader = nullptr);
  // Stops promptly: queued work is discarded, the source is interrupted so running fetches end
  // (SampleSource::interrupt; not when every batch was delivered: nothing runs then), threads are
  // joined, then the source is resumed. May be called from
  // any thread (a watchdog closing the loader while the consumer waits in next(), which then
  // returns nullptr).
  void stop();

  PipelineMetrics metrics() const;
  const BatchLayout& layout() const { return *layout_; }
  // Bytes the pool holds: buffers x batch size (plus any extra buffers a kept batch forced).
  std::size_t pool_bytes() const;
  // The device worker when buffers may be page-locked (try_pin and a CUDA device), else null.
  // pinning_detail(): the device and the runtime, or why buffers are pageable.
  const std::shared_ptr<DeviceWorker>& cuda_worker() const { return cuda_; }
  const std::string& pinning_detail() const { return pinning_detail_; }

 private:
  struct Job;
  void stop_locked();  // stop() with control_mutex_ held
  void schedule(std::shared_ptr<Job> first);
  void run_scheduler(std::uint64_t epoch,
                     const std::shared_ptr<const std::vector<PlannedBatch>>& batches);
  void fetch_sample(const std::shared_ptr<Job>& job, std::size_t i);
  void place_and_copy(const std::shared_ptr<Job>& job);
  void copy_chunk(const std::shared_ptr<Job>& job, std::size_t placed, std::int64_t first,
                  std::int64_t last);
  // The steps themselves; each runs inside `guarded` (through the functions above).
  void place_and_copy_step(const std::shared_ptr<Job>& job);
  void copy_chunk_step(const std::shared_ptr<Job>& job, std::size_t placed, std::int64_t first,
                       std::int64_t last);
  void finish_step(const std::shared_ptr<Job>& job);
  // Runs one step of a batch's assembly; an exception there ends the epoch (rethrown by next(),
  // naming the batch) instead of escaping into the thread pool.
  template <typename Step>
  void guarded(const std::shared_ptr<Job>& job, Step&& step);
  void fail(std::exception_ptr error);
  void deliver(std::shared_ptr<BatchLease> lease, std::int64_t sequence);

  const std::shared_ptr<const BatchLayout> layout_;
  const std::shared_ptr<const TokenDataset> dataset_;
  const std::shared_ptr<SampleSource> source_;
  const PipelineOptions options_;
  std::string pinning_detail_;
  const std::shared_ptr<DeviceWorker> cuda_;  // before pool_: its buffers are pinned through it
  const std::shared_ptr<BufferPool> pool_;

  std::mutex control_mutex_;  // serialises start() and stop(): they may come from two threads
  std::unique_ptr<ThreadPool> workers_;
  std::thread scheduler_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable ready_changed_;
  std::map<std::int64_t, std::shared_ptr<BatchLease>> ready_by_sequence_;  // in-order delivery
  std::deque<std::shared_ptr<BatchLease>> ready_fifo_;                     // as-ready delivery
  std::int64_t next_sequence_ = 0;  // in order: the sequence `next()` hands out next
  std::int64_t total_batches_ = 0;
  std::int64_t delivered_ = 0;
  int in_flight_ = 0;
  bool consumer_waiting_ = false;
  std::exception_ptr error_;
  PipelineMetrics metrics_;
  double start_time_ = 0;
};

}  // namespace draftfeed
