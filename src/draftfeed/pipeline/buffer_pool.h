// A pool of batch buffers, `buffers` deep (PipelineOptions::buffers), shared between the pipeline
// and the batches it delivered.
//
// A buffer holds every tensor of a batch, each in its own slot (the layout's). A delivered batch
// holds its buffer through a `BatchLease`, and each tensor handed to the consumer holds its own
// slot (`SlotRegion::hold`), not the batch. A buffer is free again once its lease and every view
// of it are gone: the usual case, where the consumer drops a batch a step or two later. When the
// consumer waits and no buffer can come otherwise (it kept tensors of every buffer), the pool takes
// a buffer whose batch is gone but some of whose tensors are still held (say `input_ids`, kept for
// logging) and gives just those slots memory of their own for the new batch (counted in
// held_slot_bytes while it lasts): a kept tensor pins its slot, never a batch. Only a consumer that
// keeps whole batches (their Batch objects) makes the pool grow by a buffer (`extra_buffers`).
//
// Batch memory at any time: (buffers + extra_buffers) x buffer bytes + the slots of kept tensors.
//
// Memory the device may read after release (page-locked host memory, device memory: see
// cuda/read_fence.h) is marked when released, on the stream its consumer was given
// (Handle::set_reader_stream): when the batch's lease goes and when each held slot is let go. The
// pool prefers a buffer whose reads have passed; whoever takes a buffer waits for (or orders its
// writes after) the rest before writing (Handle::wait_until_unread, order_after_reads).
// Thread safety: all methods may be called from any thread; `acquire` and the Handle's waits only
// from draftfeed's own threads with the device current (they may ask the CUDA runtime).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "draftfeed/cuda/memory_block.h"

namespace draftfeed {

class BufferPool;

// One slot's memory: inside a pool buffer, or its own allocation. Alive while anything holds it.
class SlotRegion {
 public:
  SlotRegion(std::shared_ptr<MemoryBlock> storage, std::uint8_t* data, std::size_t bytes)
      : storage_(std::move(storage)), data_(data), bytes_(bytes) {}
  std::uint8_t* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // Consumers (tensor views) mark the region in use; the pool does not reuse a held region. The
  // last release marks the device's reads of it on the reader stream (see above).
  void hold() { holds_.fetch_add(1, std::memory_order_relaxed); }
  void release();
  bool held() const { return holds_.load(std::memory_order_acquire) > 0; }
  bool pinned() const { return storage_->pinned(); }
  const std::shared_ptr<MemoryBlock>& storage() const { return storage_; }
  // The stream the consumer's copies of this slot are queued on (0: the default stream).
  void set_reader_stream(CudaStream stream) {
    reader_stream_.store(stream, std::memory_order_relaxed);
  }
  CudaStream reader_stream() const { return reader_stream_.load(std::memory_order_relaxed); }

 private:
  friend class BufferPool;
  std::shared_ptr<MemoryBlock> storage_;  // keeps the memory alive with the region
  std::uint8_t* data_;
  std::size_t bytes_;
  std::atomic<int> holds_{0};
  std::atomic<CudaStream> reader_stream_{nullptr};
  std::weak_ptr<BufferPool> pool_;  // set for a pool buffer's own regions: told when free
};

// Where the slots of a buffer lie: (offset, bytes) each, in the layout's order.
struct SlotSpan {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Makes the memory of one buffer (or of one slot a consumer still held) of the given bytes.
  using Allocator = std::function<std::shared_ptr<MemoryBlock>(std::size_t bytes)>;
  static std::shared_ptr<BufferPool> create(std::size_t buffer_bytes, std::vector<SlotSpan> slots,
                                            int buffers, Allocator allocate);

 private:
  struct Buffer {
    std::shared_ptr<MemoryBlock> storage;
    std::vector<std::shared_ptr<SlotRegion>> regions;  // the buffer's own, one per slot
    bool leased = false;                               // a batch in it is not yet gone
    bool held() const;
  };

 public:
  // A buffer taken from the pool, with one region per slot (its own, or a replacement for one a
  // consumer still holds); returns the buffer when destroyed.
  class Handle {
   public:
    Handle(std::shared_ptr<BufferPool> pool, Buffer* buffer);
    ~Handle();
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    const std::vector<std::shared_ptr<SlotRegion>>& regions() const { return regions_; }
    std::vector<std::uint8_t*> memory() const;
    bool pinned() const;
    // The stream the consumer of this batch queues its copies on: its reads are marked there.
    void set_reader_stream(CudaStream stream);
    // The reads queued so far on `stream` (draftfeed's own copies) are marked now, on the calling
    // thread (device current); nothing more is marked when the handle goes.
    void mark_reads_now(CudaStream stream);
    // Draftfeed's own writes into this (device) buffer queued on `stream` until now, marked now on
    // the calling thread: the memory is given back or reused only after them. The consumer's reads
    // are still marked when the handle goes.
    void mark_writes_now(CudaStream stream);
    // Before writing: blocks until the device's reads of the buffer's own memory have passed.
    void wait_until_unread() const;
    // Before writing with copies on `stream`: makes it wait, on the device, for those reads.
    void order_after_reads(CudaStream stream) const;

   private:
    std::shared_ptr<BufferPool> pool_;
    Buffer* buffer_;
    std::vector<std::shared_ptr<SlotRegion>> regions_;
    CudaStream reader_stream_ = nullptr;
    bool reads_marked_ = false;
  };

  // Waits for a free buffer; `grow_if()` is polled while waiting (and on every release) and, when
  // it says so, a new buffer is allocated instead. Returns nullptr if `cancelled()` becomes true.
  template <typename Cancelled, typename GrowIf>
  std::unique_ptr<Handle> acquire(Cancelled cancelled, GrowIf grow_if) {
    Buffer* buffer = nullptr;
    {
      std::unique_lock lock(mutex_);
      for (;;) {
        if (cancelled()) return nullptr;
        buffer = take_free_locked(false);
        if (buffer != nullptr) break;
        if (grow_if()) {
          // Nothing will come back otherwise: a buffer whose batch is gone but whose tensors are
          // partly kept (its held slots are replaced), else a new buffer.
          buffer = take_free_locked(true);
          if (buffer == nullptr) {
            all_.push_back(make_buffer());
            ++extra_buffers_;
            buffer = all_.back().get();
          }
          break;
        }
        released_.wait(lock);
      }
      buffer->leased = true;
    }
    return std::make_unique<Handle>(shared_from_this(), buffer);
  }

  // Wakes `acquire` so it re-evaluates its predicates.
  void poke() {
    { std::lock_guard lock(mutex_); }  // so a waiter between its check and its wait is not missed
    released_.notify_all();
  }

  std::size_t buffer_bytes() const { return buffer_bytes_; }
  int buffers() const;
  int extra_buffers() const;
  bool pinned() const;
  // Bytes of slots the pool allocated apart because a consumer held the buffer's own (alive now).
  std::size_t held_slot_bytes() const { return held_bytes_counter_->load(); }

 private:
  BufferPool(std::size_t buffer_bytes, std::vector<SlotSpan> slots, Allocator allocate)
      : buffer_bytes_(buffer_bytes), slots_(std::move(slots)), allocate_(std::move(allocate)) {}
  std::unique_ptr<Buffer> make_buffer();
  // A buffer no batch is in whose slots no view holds (or, with `partly_held`, one with some),
  // one whose device reads have passed first; nullptr if none.
  Buffer* take_free_locked(bool partly_held);
  void give_back(Buffer* buffer);
  friend class SlotRegion;
  void region_freed();

  const std::size_t buffer_bytes_;
  const std::vector<SlotSpan> slots_;
  const Allocator allocate_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<Buffer>> all_;  // leased or not: see Buffer::leased
  int extra_buffers_ = 0;
  // Shared with the allocations it counts, which may outlive the pool.
  std::shared_ptr<std::atomic<std::size_t>> held_bytes_counter_ =
      std::make_shared<std::atomic<std::size_t>>(0);
};

}  // namespace draftfeed
