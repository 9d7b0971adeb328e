#include "draftfeed/pipeline/device_stage.h"

#include <chrono>
#include <utility>

#include "draftfeed/common/error.h"
#include "draftfeed/cuda/cuda_event.h"
#include "draftfeed/cuda/cuda_runtime.h"
#include "draftfeed/cuda/device_buffer.h"

namespace draftfeed {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DeviceStage::DeviceStage(std::shared_ptr<const BatchLayout> layout,
                         std::shared_ptr<DeviceWorker> worker, int buffers)
    : layout_(std::move(layout)), worker_(std::move(worker)), buffers_(std::max(1, buffers)) {
  worker_->run([this] {
    void* stream = nullptr;
    // Non-blocking: the legacy default stream (torch's default) does not wait for our copies,
    // nor they for it, unless told to by an event.
    check_cuda(cuda_runtime().stream_create(&stream, kCudaStreamNonBlocking),
               "cudaStreamCreateWithFlags", worker_->device());
    copy_stream_ = stream;
  });
}

DeviceStage::~DeviceStage() {
  begin_stop();
  join();
  // Queued copies complete first; the runtime releases the stream then.
  worker_->post([stream = copy_stream_] { cuda_runtime().stream_destroy(stream); });
}

void DeviceStage::set_allocator(std::shared_ptr<DeviceAllocator> allocator) {
  allocator_ = allocator ? std::move(allocator) : runtime_device_allocator();
}

void DeviceStage::start(Upstream upstream) {
  join();
  // The previous epoch's buffers, if the consumer still holds some of its batches; else new ones,
  // once the old ones are freed (after the device's last reads of them), so that device memory
  // never holds two epochs' buffers.
  std::shared_ptr<BufferPool> pool = previous_pool_.lock();
  if (!pool) {
    if (had_pool_) worker_->settle();
    pool = BufferPool::create(
        layout_->total_bytes, batch_slot_spans(*layout_), buffers_,
        [worker = worker_, allocator = allocator_, live = device_bytes_,
         peak = peak_device_bytes_](std::size_t bytes) {
          auto buffer = std::make_shared<DeviceBuffer>(bytes, worker, allocator);
          const std::size_t now = live->fetch_add(bytes) + bytes;
          std::size_t seen = peak->load();
          while (now > seen && !peak->compare_exchange_weak(seen, now)) {
          }
          DeviceBuffer* raw = buffer.get();
          return std::shared_ptr<MemoryBlock>(raw, [buffer, live, bytes](MemoryBlock*) mutable {
            live->fetch_sub(bytes);
            buffer.reset();
          });
        });
    had_pool_ = true;
  }
  previous_pool_ = pool;
  {
    std::lock_guard lock(mutex_);
    pool_ = pool;
    ready_.clear();
    stopping_ = false;
    finished_ = false;
    error_ = nullptr;
    start_time_ = now_seconds();
    counts_.first_batch_seconds = -1;
  }
  copier_ = std::thread([this, upstream = std::move(upstream), pool = std::move(pool)] {
    run_copier(upstream, pool);
  });
}

void DeviceStage::poke_pool() const {
  std::shared_ptr<BufferPool> pool;
  {
    std::lock_guard lock(mutex_);
    pool = pool_;
  }
  if (pool) pool->poke();
}

void DeviceStage::begin_stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  poke_pool();
  changed_.notify_all();
}

void DeviceStage::join() {
  if (copier_.joinable()) copier_.join();
  // Batches not handed out go back, and the epoch's device memory is freed once the consumer's
  // batches are gone too. Outside our lock: a buffer going back takes the pool's.
  std::deque<std::shared_ptr<BatchLease>> dropped;
  std::shared_ptr<BufferPool> pool;
  std::lock_guard lock(mutex_);
  dropped.swap(ready_);
  pool.swap(pool_);
}

void DeviceStage::run_copier(const Upstream& upstream, const std::shared_ptr<BufferPool>& pool) {
  try {
    make_device_current(worker_->device());
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
      }
      std::shared_ptr<BatchLease> host = upstream(copy_stream_);
      if (!host) {
        std::lock_guard lock(mutex_);
        finished_ = true;
        break;
      }
      std::shared_ptr<BatchLease> device = copy_to_device(host, *pool);
      host.reset();         // the host buffer goes back to its pool (rewritten after the copy)
      if (!device) return;  // stopping
      {
        std::lock_guard lock(mutex_);
        ready_.push_back(std::move(device));
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
  changed_.notify_all();
}

std::shared_ptr<BatchLease> DeviceStage::copy_to_device(const std::shared_ptr<BatchLease>& host,
                                                        BufferPool& pool) {
  require(
      host->buffer != nullptr && host->layout->total_bytes == layout_->total_bytes,
      ErrorKind::kRuntime,
      "batch " + std::to_string(host->index) + " is not in a pool buffer of the stage's layout");
  auto buffer = pool.acquire(
      [this] {
        std::lock_guard lock(mutex_);
        return stopping_;
      },
      [this] {
        // Grow only when the consumer waits and keeps every device buffer (see BufferPool).
        std::lock_guard lock(mutex_);
        return consumer_waiting_ && ready_.empty();
      });
  if (!buffer) return nullptr;
  const CudaRuntime& rt = cuda_runtime();
  // The consumer's stream may still read this device memory: the copies wait for it there.
  buffer->order_after_reads(copy_stream_);
  const std::vector<std::uint8_t*> memory = buffer->memory();
  for (std::size_t s = 0; s < layout_->tensors.size(); ++s) {
    check_cuda(rt.memcpy_async(memory[s], host->memory[s], layout_->tensors[s].nbytes,
                               kCudaMemcpyHostToDevice, copy_stream_),
               "cudaMemcpyAsync", worker_->device());
  }
  auto copied = std::make_shared<CudaEvent>(worker_);
  copied->record(copy_stream_);
  // A batch never handed out (the loader stopped) is given back with its copy maybe still queued:
  // its memory (torch's, with given memory) goes back only after the copy.
  buffer->mark_writes_now(copy_stream_);
  // The host buffer goes back to its pool now; it is rewritten only after these copies.
  host->buffer->mark_reads_now(copy_stream_);

  auto device = std::make_shared<BatchLease>();
  device->layout = layout_;
  device->memory = memory;
  device->regions = buffer->regions();
  device->index = host->index;
  device->planned_samples = host->planned_samples;
  device->used_samples = host->used_samples;
  device->tokens = host->tokens;
  device->locally_empty = host->locally_empty;
  device->failure_count = host->failure_count;
  device->fatal = host->fatal;
  device->fatal_message = std::move(host->fatal_message);
  device->dropped = host->dropped;
  device->drop_messages = std::move(host->drop_messages);
  device->placement = std::move(host->placement);
  device->rows = std::move(host->rows);
  device->buffer = std::move(buffer);
  device->device = worker_->device();
  device->ready_event = std::move(copied);
  return device;
}

std::shared_ptr<BatchLease> DeviceStage::next(CudaStream consumer) {
  const double wait_start = now_seconds();
  std::shared_ptr<BatchLease> lease;
  std::shared_ptr<BufferPool> released;  // let go of after our lock (a pool takes its own)
  {
    std::unique_lock lock(mutex_);
    auto available = [&] { return !ready_.empty() || finished_ || error_ || stopping_; };
    if (!available()) {
      consumer_waiting_ = true;
      lock.unlock();
      poke_pool();  // the copier may need to grow the device pool for us
      lock.lock();
      changed_.wait(lock, available);
      consumer_waiting_ = false;
    }
    counts_.consumer_wait_seconds += now_seconds() - wait_start;
    if (error_) std::rethrow_exception(error_);
    if (ready_.empty()) {
      // The epoch is over: its device memory goes once the consumer's last batches are gone.
      if (finished_) released = std::move(pool_);
      return nullptr;
    }
    lease = std::move(ready_.front());
    ready_.pop_front();
  }
  // On the device: the consumer's work on this batch starts after its copy.
  worker_->run([&] {
    if (!lease->ready_event->done()) lease->ready_event->make_wait(consumer);
  });
  lease->buffer->set_reader_stream(consumer);
  std::lock_guard lock(mutex_);
  count_delivered(counts_, *lease, now_seconds() - start_time_);
  return lease;
}

void DeviceStage::fill_metrics(PipelineMetrics& metrics) const {
  // The pool's figures first, without our lock: the pool's waiters take our lock inside theirs.
  std::shared_ptr<BufferPool> pool;
  {
    std::lock_guard lock(mutex_);
    pool = pool_ ? pool_ : previous_pool_.lock();
  }
  metrics.device_extra_buffers = pool ? pool->extra_buffers() : 0;
  metrics.device_held_slot_bytes = pool ? pool->held_slot_bytes() : 0;
  pool.reset();
  std::lock_guard lock(mutex_);
  metrics.batches = counts_.batches;
  metrics.tokens = counts_.tokens;
  metrics.hidden_bytes = counts_.hidden_bytes;
  metrics.batch_bytes = counts_.batch_bytes;
  metrics.dropped = counts_.dropped;
  metrics.consumer_wait_seconds = counts_.consumer_wait_seconds;
  metrics.first_batch_seconds = counts_.first_batch_seconds;
  metrics.ready += static_cast<int>(ready_.size());
  metrics.device = worker_->device();
  metrics.device_buffers = buffers_;
  metrics.device_buffer_bytes = layout_->total_bytes;
  metrics.device_bytes = device_bytes_->load();
  metrics.device_peak_bytes = peak_device_bytes_->load();
}

}  // namespace draftfeed
