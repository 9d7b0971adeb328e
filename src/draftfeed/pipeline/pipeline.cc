#include "draftfeed/pipeline/pipeline.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>

#include "draftfeed/batch/compressed_rows_copy.h"
#include "draftfeed/batch/sample_copy.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::size_t index_of(DropReason reason) { return static_cast<std::size_t>(reason); }

// Bytes of hidden-state data in one batch row (every floating tensor's row).
std::int64_t hidden_row_bytes(const BatchLayout& layout) {
  std::int64_t bytes = 0;
  for (const auto& slot : layout.tensors) {
    if (slot.dtype != DType::kI64) {
      bytes += static_cast<std::int64_t>(slot.nbytes) / layout.spec.max_len;
    }
  }
  return bytes;
}

std::shared_ptr<DeviceWorker> pinning_worker(const PipelineOptions& options, std::string* detail) {
  if (!options.try_pin) {
    *detail = "pin_memory is off";
    return nullptr;
  }
  const int device = resolve_cuda_device(options.cuda_device);
  auto worker = DeviceWorker::for_device(device, detail);
  if (worker) {
    *detail = "page-locked for cuda:" + std::to_string(device) + ", " + cuda_runtime().detail;
  }
  return worker;
}

}  // namespace

std::vector<SlotSpan> batch_slot_spans(const BatchLayout& layout) {
  std::vector<SlotSpan> spans;
  for (const TensorSlot& slot : layout.tensors) spans.push_back({slot.offset, slot.nbytes});
  return spans;
}

void count_delivered(PipelineMetrics& metrics, const BatchLease& lease, double since_start) {
  if (metrics.first_batch_seconds < 0) metrics.first_batch_seconds = since_start;
  ++metrics.batches;
  metrics.tokens += lease.tokens;
  metrics.hidden_bytes += lease.tokens * hidden_row_bytes(*lease.layout);
  metrics.batch_bytes += static_cast<std::int64_t>(lease.layout->total_bytes);
  for (std::size_t r = 0; r < lease.dropped.size(); ++r) metrics.dropped[r] += lease.dropped[r];
}

struct Pipeline::Job {
  std::int64_t sequence = 0;
  std::uint64_t epoch = 0;
  PlannedBatch plan;
  std::unique_ptr<BufferPool::Handle> buffer;
  std::shared_ptr<const BatchLayout> layout;  // the pipeline's, or a larger one for `overflow`
  std::shared_ptr<HostBuffer> overflow;       // kCustom samples with more rows than max_len
  BatchMemory memory;                         // the buffer's slots, or the overflow's
  std::vector<FetchOutcome> outcomes;
  std::vector<IntArrayView> ids;
  std::vector<IntArrayView> masks;
  std::vector<std::uint8_t> usable;  // bytes: each fetch task writes its own entry
  std::vector<std::int64_t> rows;    // per sample, after preprocess
  BatchPlacement placement;
  std::unique_ptr<SampleCopy[]> copies;  // per sample: its copy into the batch, and what it found
  std::atomic<std::int64_t> pending{0};
};

void PipelineOptions::validate() const {
  require(num_threads > 0, ErrorKind::kInvalidArgument,
          "num_threads must be >= 1, got " + std::to_string(num_threads));
  require(chunk_bytes > 0, ErrorKind::kInvalidArgument,
          "chunk_bytes must be positive, got " + std::to_string(chunk_bytes));
  require(max_drop_examples >= 0, ErrorKind::kInvalidArgument,
          "max_drop_examples must be >= 0, got " + std::to_string(max_drop_examples));
  require(!device_stage || device_buffers >= 1, ErrorKind::kInvalidArgument,
          "device_buffers must be at least 1, got " + std::to_string(device_buffers));
}

Pipeline::Pipeline(BatchLayout layout, std::shared_ptr<const TokenDataset> dataset,
                   std::shared_ptr<SampleSource> source, PipelineOptions options)
    : layout_(std::make_shared<const BatchLayout>(std::move(layout))),
      dataset_(std::move(dataset)),
      source_(std::move(source)),
      options_(options),
      cuda_(pinning_worker(options, &pinning_detail_)),
      pool_(BufferPool::create(layout_->total_bytes, batch_slot_spans(*layout_),
                               std::max(1, options.buffers), [worker = cuda_](std::size_t bytes) {
                                 return std::make_shared<HostBuffer>(bytes, worker);
                               })) {
  require(dataset_ != nullptr && source_ != nullptr, ErrorKind::kInvalidArgument,
          "pipeline needs a dataset and a sample source");
  require(dataset_->has_loss_mask(), ErrorKind::kInvalidArgument,
          dataset_->folder() + ": the dataset has no loss_mask column");
  options_.validate();
}

Pipeline::~Pipeline() { stop(); }

std::size_t Pipeline::pool_bytes() const {
  return pool_->buffer_bytes() * static_cast<std::size_t>(pool_->buffers());
}

void Pipeline::start(std::uint64_t epoch, std::vector<PlannedBatch> batches) {
  start(epoch, std::make_shared<const std::vector<PlannedBatch>>(std::move(batches)));
}

void Pipeline::start(std::uint64_t epoch, std::shared_ptr<const std::vector<PlannedBatch>> plan) {
  std::lock_guard control(control_mutex_);
  stop_locked();
  {
    std::lock_guard lock(mutex_);
    ready_by_sequence_.clear();
    ready_fifo_.clear();
    next_sequence_ = 0;
    total_batches_ = static_cast<std::int64_t>(plan->size());
    delivered_ = 0;
    in_flight_ = 0;
    error_ = nullptr;
    start_time_ = now_seconds();
    metrics_.first_batch_seconds = -1;
  }
  stopping_ = false;
  // The source's blocked fetches get threads of their own (SampleSource::blocking_fetches).
  workers_ = std::make_unique<ThreadPool>(options_.num_threads + source_->blocking_fetches());
  scheduler_ = std::thread([this, epoch, plan = std::move(plan)] { run_scheduler(epoch, plan); });
}

void Pipeline::stop() {
  std::lock_guard control(control_mutex_);
  stop_locked();
}

void Pipeline::stop_locked() {
  bool running = scheduler_.joinable() || workers_ != nullptr;
  {
    // Once every batch was delivered no fetch is under way: the source is not interrupted, so
    // what it fetches ahead for the next epoch (a lookahead) goes on.
    std::lock_guard lock(mutex_);
    running = running && (error_ != nullptr || delivered_ < total_batches_);
  }
  stopping_ = true;
  pool_->poke();
  ready_changed_.notify_all();
  // A fetch under way may block for long (an online request); the source ends it now.
  if (running) source_->interrupt();
  if (scheduler_.joinable()) scheduler_.join();
  if (workers_) {
    workers_->shutdown(/*discard_pending=*/true);
    workers_.reset();
  }
  if (running) source_->resume();
  // Leases return their buffers to the pool as they are destroyed: do that outside our lock.
  std::map<std::int64_t, std::shared_ptr<BatchLease>> by_sequence;
  std::deque<std::shared_ptr<BatchLease>> fifo;
  std::lock_guard lock(mutex_);
  by_sequence.swap(ready_by_sequence_);
  fifo.swap(ready_fifo_);
  in_flight_ = 0;
}

void Pipeline::run_scheduler(std::uint64_t epoch,
                             const std::shared_ptr<const std::vector<PlannedBatch>>& plan) {
  const std::vector<PlannedBatch>& batches = *plan;
  if (cuda_) {
    // This thread asks the runtime whether a buffer's device reads have passed.
    try {
      make_device_current(cuda_->device());
    } catch (...) {
      fail(std::current_exception());
      return;
    }
  }
  for (std::size_t s = 0; s < batches.size(); ++s) {
    auto buffer = pool_->acquire([this] { return stopping_.load(); },
                                 [this] {
                                   // Grow only when the consumer waits and nothing can come: every
                                   // buffer is held by batches the consumer kept.
                                   std::lock_guard lock(mutex_);
                                   return consumer_waiting_ && in_flight_ == 0 &&
                                          ready_by_sequence_.empty() && ready_fifo_.empty();
                                 });
    if (!buffer) return;
    try {
      // A copy the consumer queued from this buffer may not have run yet (page-locked memory).
      buffer->wait_until_unread();
    } catch (...) {
      fail(std::current_exception());
      return;
    }
    auto job = std::make_shared<Job>();
    job->sequence = static_cast<std::int64_t>(s);
    job->epoch = epoch;
    job->plan = batches[s];  // a copy: the source may still be reading the plan
    job->buffer = std::move(buffer);
    const std::size_t n = job->plan.rows.size();
    job->outcomes.resize(n);
    job->ids.resize(n);
    job->masks.resize(n);
    job->usable.assign(n, 0);
    job->rows.assign(n, 0);
    job->copies = std::make_unique<SampleCopy[]>(n);
    {
      std::lock_guard lock(mutex_);
      ++in_flight_;
    }
    if (n == 0) {
      workers_->submit(job->sequence, [this, job] { place_and_copy(job); });
      continue;
    }
    job->pending = static_cast<std::int64_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      workers_->submit(job->sequence, [this, job, i] { fetch_sample(job, i); });
    }
  }
}

void Pipeline::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(error);
  }
  stopping_ = true;
  pool_->poke();
  ready_changed_.notify_all();
}

void Pipeline::fetch_sample(const std::shared_ptr<Job>& job, std::size_t i) {
  if (stopping_) return;
  try {
    const std::int64_t row = job->plan.rows[i];
    job->ids[i] = dataset_->input_ids(row);
    job->masks[i] = dataset_->loss_mask(row);
    FetchOutcome outcome = source_->fetch(row, job->ids[i]);
    const bool fatal_in_batch =
        options_.fatal_failures_in_batch && outcome.reason == DropReason::kGenerationFailed;
    if (outcome.fatal && !fatal_in_batch) throw Error(ErrorKind::kRuntime, outcome.message);
    if (outcome.sample) {
      const HiddenStatesView& hs = outcome.sample->hidden;
      const BatchSpec& spec = layout_->spec;
      const bool mtp = spec.preprocess == Preprocess::kMtp;
      const bool fits = hs.hidden == spec.hidden_size &&
                        (mtp ? hs.layers >= 1 : hs.layers == spec.num_target_layers + 1) &&
                        hs.tokens == job->ids[i].size();
      if (!fits) {
        outcome = FetchOutcome::dropped(
            DropReason::kInvalid,
            "row " + std::to_string(row) + ": hidden states [" + std::to_string(hs.tokens) + ", " +
                std::to_string(hs.layers) + ", " + std::to_string(hs.hidden) +
                "] do not fit the batch (expected [" + std::to_string(job->ids[i].size()) + ", " +
                std::to_string(spec.num_target_layers + 1) + ", " +
                std::to_string(spec.hidden_size) + "])");
      }
    }
    job->usable[i] = outcome.sample.has_value() ? 1 : 0;
    job->rows[i] = sample_rows_after_preprocess(layout_->spec.preprocess, job->ids[i].size());
    job->outcomes[i] = std::move(outcome);
  } catch (...) {
    fail(std::current_exception());
    return;
  }
  if (job->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) place_and_copy(job);
}

template <typename Step>
void Pipeline::guarded(const std::shared_ptr<Job>& job, Step&& step) {
  const std::string batch = "batch " + std::to_string(job->plan.index);
  try {
    step();
  } catch (const Error& e) {
    fail(std::make_exception_ptr(Error(e.kind(), batch + ": " + e.what())));
  } catch (const std::exception& e) {
    fail(std::make_exception_ptr(Error(ErrorKind::kRuntime, batch + ": " + e.what())));
  } catch (...) {
    fail(std::make_exception_ptr(Error(ErrorKind::kRuntime, batch + ": an unknown exception")));
  }
}

void Pipeline::place_and_copy(const std::shared_ptr<Job>& job) {
  if (stopping_) return;
  guarded(job, [&] { place_and_copy_step(job); });
}

void Pipeline::place_and_copy_step(const std::shared_ptr<Job>& job) {
  const BatchSpec& spec = layout_->spec;
  job->layout = layout_;
  job->overflow.reset();
  job->memory = job->buffer->memory();
  if (spec.preprocess == Preprocess::kCustom) {
    job->placement = place_unpacked(job->rows, job->usable);
    if (job->placement.used_rows > spec.max_len) {
      // Samples longer than a batch, or an overfull batch list: a buffer of this batch's own.
      BatchSpec larger = spec;
      larger.max_len = job->placement.used_rows;
      job->layout = std::make_shared<const BatchLayout>(make_batch_layout(larger));
      job->overflow = std::make_shared<HostBuffer>(job->layout->total_bytes, nullptr);
      job->memory = contiguous_memory(*job->layout, job->overflow->data());
    }
  } else {
    job->placement = place_samples(spec.max_len, job->rows, job->usable);
  }
  // Split every placed sample's rows into chunks of about `chunk_bytes`.
  const std::int64_t row_bytes = std::max<std::int64_t>(1, hidden_row_bytes(*job->layout));
  const std::int64_t chunk_rows = std::max<std::int64_t>(1, options_.chunk_bytes / row_bytes);
  struct Chunk {
    std::size_t placed;
    std::int64_t first, last;
  };
  std::vector<Chunk> chunks;
  for (std::size_t p = 0; p < job->placement.samples.size(); ++p) {
    const std::int64_t rows = job->placement.samples[p].rows;
    const FetchedSample& sample = *job->outcomes[job->placement.samples[p].sample].sample;
    const std::int64_t step =
        sample.compressed ? compressed_chunk_rows(sample, chunk_rows) : chunk_rows;
    for (std::int64_t first = 0; first < rows; first += step) {
      chunks.push_back({p, first, std::min(rows, first + step)});
    }
  }
  if (chunks.empty()) {
    finish_step(job);
    return;
  }
  job->pending = static_cast<std::int64_t>(chunks.size());
  // Run the first chunk here (this thread is warm); queue the rest for the other workers.
  for (std::size_t c = 1; c < chunks.size(); ++c) {
    const Chunk chunk = chunks[c];
    workers_->submit(job->sequence, [this, job, chunk] {
      copy_chunk(job, chunk.placed, chunk.first, chunk.last);
    });
  }
  copy_chunk_step(job, chunks[0].placed, chunks[0].first, chunks[0].last);
}

void Pipeline::copy_chunk(const std::shared_ptr<Job>& job, std::size_t placed, std::int64_t first,
                          std::int64_t last) {
  if (stopping_) return;
  guarded(job, [&] { copy_chunk_step(job, placed, first, last); });
}

void Pipeline::copy_chunk_step(const std::shared_ptr<Job>& job, std::size_t placed,
                               std::int64_t first, std::int64_t last) {
  const SamplePlacement& placement = job->placement.samples[placed];
  const std::size_t i = placement.sample;
  job->copies[i].copy_rows(*job->layout, job->memory, placement, *job->outcomes[i].sample,
                           job->plan.rows[i],
                           NoiseContext{layout_->spec.noise.enabled(), job->epoch}, first, last);
  if (job->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_step(job);
}

void Pipeline::finish_step(const std::shared_ptr<Job>& job) {
  if (stopping_) return;
  // A sample the copy found bad (SampleCopy::finish) is dropped like any failed sample; the
  // batch is packed again without it.
  bool repack = false;
  for (const SamplePlacement& p : job->placement.samples) {
    std::optional<FetchOutcome> drop =
        job->copies[p.sample].finish(*job->outcomes[p.sample].sample, job->plan.rows[p.sample]);
    if (!drop) continue;
    job->usable[p.sample] = 0;
    job->outcomes[p.sample] = std::move(*drop);
    repack = true;
  }
  if (repack) {
    place_and_copy_step(job);
    return;
  }
  if (const std::optional<UnreadableSample> unreadable =
          finish_batch(*job->layout, job->memory, job->placement, job->ids, job->masks)) {
    // The dataset shard of a row shrank under the epoch: the row is dropped and counted, the
    // batch packed again without it (as a sample whose cache file shrank).
    const std::size_t i = job->placement.samples[unreadable->placed].sample;
    job->usable[i] = 0;
    job->outcomes[i] = FetchOutcome::dropped(
        DropReason::kInvalid,
        unreadable_row(job->ids[i], job->plan.rows[i], unreadable->column).what());
    place_and_copy_step(job);
    return;
  }

  auto lease = std::make_shared<BatchLease>();
  lease->layout = job->layout;
  lease->memory = job->memory;
  if (job->overflow) {
    for (std::size_t s = 0; s < job->layout->tensors.size(); ++s) {
      lease->regions.push_back(std::make_shared<SlotRegion>(job->overflow, job->memory[s],
                                                            job->layout->tensors[s].nbytes));
    }
  } else {
    lease->regions = job->buffer->regions();
  }
  lease->index = job->plan.index;
  lease->planned_samples = static_cast<std::int64_t>(job->plan.rows.size());
  lease->used_samples = static_cast<std::int64_t>(job->placement.samples.size());
  lease->tokens = job->placement.used_rows;
  lease->locally_empty = job->placement.locally_empty;
  for (std::size_t i = 0; i < job->outcomes.size(); ++i) {
    if (job->usable[i]) continue;
    const FetchOutcome& outcome = job->outcomes[i];
    ++lease->dropped[index_of(outcome.reason)];
    if (outcome.reason == DropReason::kGenerationFailed) ++lease->failure_count;
    if (outcome.fatal && !lease->fatal) {
      lease->fatal = true;
      lease->fatal_message = outcome.message;
    }
    if (static_cast<int>(lease->drop_messages.size()) < options_.max_drop_examples &&
        !outcome.message.empty()) {
      lease->drop_messages.push_back({outcome.reason, outcome.message});
    }
  }
  lease->placement = std::move(job->placement);
  lease->rows = std::move(job->plan.rows);
  lease->buffer = std::move(job->buffer);
  deliver(std::move(lease), job->sequence);
}

void Pipeline::deliver(std::shared_ptr<BatchLease> lease, std::int64_t sequence) {
  {
    std::lock_guard lock(mutex_);
    --in_flight_;
    if (options_.in_order) {
      ready_by_sequence_.emplace(sequence, std::move(lease));
    } else {
      ready_fifo_.push_back(std::move(lease));
    }
  }
  ready_changed_.notify_all();
}

std::shared_ptr<BatchLease> Pipeline::next(CudaStream reader) {
  const double wait_start = now_seconds();
  std::unique_lock lock(mutex_);
  auto available = [this] {
    if (error_ || delivered_ >= total_batches_) return true;
    if (options_.in_order) return ready_by_sequence_.count(next_sequence_) != 0;
    return !ready_fifo_.empty();
  };
  if (!available()) {
    consumer_waiting_ = true;
    lock.unlock();
    pool_->poke();  // the scheduler may need to grow the pool for us
    lock.lock();
    ready_changed_.wait(lock, [&] { return available() || (stopping_ && !error_); });
    consumer_waiting_ = false;
  }
  const double now = now_seconds();
  metrics_.consumer_wait_seconds += now - wait_start;
  if (error_) std::rethrow_exception(error_);
  if (delivered_ >= total_batches_ || !available()) return nullptr;

  std::shared_ptr<BatchLease> lease;
  if (options_.in_order) {
    auto it = ready_by_sequence_.find(next_sequence_);
    lease = std::move(it->second);
    ready_by_sequence_.erase(it);
    ++next_sequence_;
  } else {
    lease = std::move(ready_fifo_.front());
    ready_fifo_.pop_front();
  }
  ++delivered_;
  count_delivered(metrics_, *lease, now - start_time_);
  if (lease->buffer) lease->buffer->set_reader_stream(reader);
  return lease;
}

PipelineMetrics Pipeline::metrics() const {
  // Pool first, without our lock: the pool's waiters take our lock inside theirs.
  const int buffers = pool_->buffers();
  const int extra_buffers = pool_->extra_buffers();
  const bool pinned = pool_->pinned();
  std::lock_guard lock(mutex_);
  PipelineMetrics m = metrics_;
  m.elapsed_seconds = now_seconds() - start_time_;
  m.ready = static_cast<int>(ready_by_sequence_.size() + ready_fifo_.size());
  m.in_flight = in_flight_;
  m.buffers = buffers;
  m.extra_buffers = extra_buffers;
  m.held_slot_bytes = pool_->held_slot_bytes();
  m.pinned = pinned;
  m.buffer_bytes = pool_->buffer_bytes();
  return m;
}

}  // namespace draftfeed
