// A pool of batch buffers, `prefetch` deep, shared between the pipeline and the batches it
// delivered.
//
// A delivered batch holds its buffer through a `BatchLease`; the buffer returns to the pool only
// when the last lease (and so the last tensor viewing it) is gone, so a trainer that keeps a batch
// never sees it overwritten. If the trainer keeps every buffer and still asks for more, the pool
// grows by one rather than deadlock, and counts it (`extra_buffers`): peak memory is (buffers +
// extra) x batch bytes. Thread safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "draftfeed/pipeline/host_memory.h"

namespace draftfeed {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> create(std::size_t buffer_bytes, int buffers, bool try_pin);

  // A buffer taken from the pool; returns it when destroyed.
  class Handle {
   public:
    Handle(std::shared_ptr<BufferPool> pool, HostBuffer* buffer)
        : pool_(std::move(pool)), buffer_(buffer) {}
    ~Handle() { pool_->give_back(buffer_); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    std::uint8_t* data() const { return buffer_->data(); }
    bool pinned() const { return buffer_->pinned(); }

   private:
    std::shared_ptr<BufferPool> pool_;
    HostBuffer* buffer_;
  };

  // Waits for a free buffer; `grow_if()` is polled while waiting (and on every release) and, when
  // it says so, a new buffer is allocated instead. Returns nullptr if `cancelled()` becomes true.
  template <typename Cancelled, typename GrowIf>
  std::unique_ptr<Handle> acquire(Cancelled cancelled, GrowIf grow_if) {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (cancelled()) return nullptr;
      if (!free_.empty()) {
        HostBuffer* buffer = free_.back();
        free_.pop_back();
        return std::make_unique<Handle>(shared_from_this(), buffer);
      }
      if (grow_if()) {
        all_.push_back(std::make_unique<HostBuffer>(buffer_bytes_, try_pin_));
        ++extra_buffers_;
        return std::make_unique<Handle>(shared_from_this(), all_.back().get());
      }
      released_.wait(lock);
    }
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

 private:
  BufferPool(std::size_t buffer_bytes, bool try_pin)
      : buffer_bytes_(buffer_bytes), try_pin_(try_pin) {}
  void give_back(HostBuffer* buffer);

  const std::size_t buffer_bytes_;
  const bool try_pin_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<HostBuffer>> all_;
  std::vector<HostBuffer*> free_;
  int extra_buffers_ = 0;
};

}  // namespace draftfeed
