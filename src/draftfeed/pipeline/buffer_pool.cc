#include "draftfeed/pipeline/buffer_pool.h"

#include <algorithm>

namespace draftfeed {

std::shared_ptr<BufferPool> BufferPool::create(std::size_t buffer_bytes, int buffers,
                                               bool try_pin) {
  std::shared_ptr<BufferPool> pool(new BufferPool(buffer_bytes, try_pin));
  for (int i = 0; i < std::max(1, buffers); ++i) {
    pool->all_.push_back(std::make_unique<HostBuffer>(buffer_bytes, try_pin));
    pool->free_.push_back(pool->all_.back().get());
  }
  return pool;
}

void BufferPool::give_back(HostBuffer* buffer) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(buffer);
  }
  released_.notify_all();
}

int BufferPool::buffers() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(all_.size());
}

int BufferPool::extra_buffers() const {
  std::lock_guard lock(mutex_);
  return extra_buffers_;
}

bool BufferPool::pinned() const {
  std::lock_guard lock(mutex_);
  return !all_.empty() &&
         std::all_of(all_.begin(), all_.end(), [](const auto& b) { return b->pinned(); });
}

}  // namespace draftfeed
