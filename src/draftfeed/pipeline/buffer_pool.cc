#include "draftfeed/pipeline/buffer_pool.h"

#include <algorithm>
#include <set>

namespace draftfeed {

std::shared_ptr<BufferPool> BufferPool::create(std::size_t buffer_bytes,
                                               std::vector<SlotSpan> slots, int buffers,
                                               Allocator allocate) {
  std::shared_ptr<BufferPool> pool(
      new BufferPool(buffer_bytes, std::move(slots), std::move(allocate)));
  for (int i = 0; i < std::max(1, buffers); ++i) pool->all_.push_back(pool->make_buffer());
  return pool;
}

std::unique_ptr<BufferPool::Buffer> BufferPool::make_buffer() {
  auto buffer = std::make_unique<Buffer>();
  buffer->storage = allocate_(buffer_bytes_);
  for (const SlotSpan& span : slots_) {
    auto region = std::make_shared<SlotRegion>(buffer->storage,
                                               buffer->storage->data() + span.offset, span.bytes);
    region->pool_ = weak_from_this();
    buffer->regions.push_back(std::move(region));
  }
  return buffer;
}

bool BufferPool::Buffer::held() const {
  return std::any_of(regions.begin(), regions.end(), [](const auto& r) { return r->held(); });
}

BufferPool::Buffer* BufferPool::take_free_locked(bool partly_held) {
  Buffer* free = nullptr;
  Buffer* candidate = nullptr;
  for (const auto& buffer : all_) {
    if (buffer->leased) continue;
    if (!buffer->held()) {
      // One the device has finished reading, if any: its taker need not wait.
      const auto& fence = buffer->storage->fence();
      if (!fence || fence->passed()) return buffer.get();
      if (free == nullptr) free = buffer.get();
      continue;
    }
    if (partly_held && candidate == nullptr) candidate = buffer.get();
  }
  return free != nullptr ? free : candidate;
}

void SlotRegion::release() {
  if (holds_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last view of this slot is gone: copies the consumer queued from it were queued before.
  if (const auto& fence = storage_->fence()) fence->mark_reads_on(reader_stream());
  // Its buffer may be free now.
  if (auto pool = pool_.lock()) pool->region_freed();
}

void BufferPool::region_freed() {
  { std::lock_guard lock(mutex_); }
  released_.notify_all();
}

BufferPool::Handle::Handle(std::shared_ptr<BufferPool> pool, Buffer* buffer)
    : pool_(std::move(pool)), buffer_(buffer) {
  for (std::size_t i = 0; i < buffer_->regions.size(); ++i) {
    const std::shared_ptr<SlotRegion>& own = buffer_->regions[i];
    if (!own->held()) {
      regions_.push_back(own);
      continue;
    }
    // A tensor of an earlier batch still views this slot: this batch's goes elsewhere. The
    // allocation lives as long as its region; the counter says how much memory that is.
    const std::size_t bytes = own->bytes();
    auto counter = pool_->held_bytes_counter_;
    counter->fetch_add(bytes);
    std::shared_ptr<MemoryBlock> own_memory = pool_->allocate_(bytes);
    MemoryBlock* block = own_memory.get();
    auto storage = std::shared_ptr<MemoryBlock>(
        block, [counter, bytes, own_memory = std::move(own_memory)](MemoryBlock*) mutable {
          counter->fetch_sub(bytes);
          own_memory.reset();
        });
    regions_.push_back(std::make_shared<SlotRegion>(storage, storage->data(), bytes));
  }
}

namespace {

// Each fence of the regions' memory once (a buffer's own slots share one).
template <typename Mark>
void for_each_fence(const std::vector<std::shared_ptr<SlotRegion>>& regions, Mark&& mark) {
  std::set<const MemoryBlock*> seen;
  for (const auto& region : regions) {
    const auto& fence = region->storage()->fence();
    if (fence && seen.insert(region->storage().get()).second) mark(*fence);
  }
}

}  // namespace

BufferPool::Handle::~Handle() {
  // The batch is gone: whatever the consumer queued from any of its memory was queued before.
  if (!reads_marked_) {
    for_each_fence(regions_, [&](ReadFence& fence) { fence.mark_reads_on(reader_stream_); });
  }
  pool_->give_back(buffer_);
}

void BufferPool::Handle::mark_reads_now(CudaStream stream) {
  for_each_fence(regions_, [&](ReadFence& fence) { fence.mark_reads_on_now(stream); });
  reads_marked_ = true;
}

void BufferPool::Handle::mark_writes_now(CudaStream stream) {
  for_each_fence(regions_, [&](ReadFence& fence) { fence.mark_reads_on_now(stream); });
}

void BufferPool::Handle::set_reader_stream(CudaStream stream) {
  reader_stream_ = stream;
  for (const auto& region : regions_) region->set_reader_stream(stream);
}

void BufferPool::Handle::wait_until_unread() const {
  if (const auto& fence = buffer_->storage->fence()) fence->wait();
}

void BufferPool::Handle::order_after_reads(CudaStream stream) const {
  if (const auto& fence = buffer_->storage->fence()) fence->order_after(stream);
}

std::vector<std::uint8_t*> BufferPool::Handle::memory() const {
  std::vector<std::uint8_t*> out;
  out.reserve(regions_.size());
  for (const auto& region : regions_) out.push_back(region->data());
  return out;
}

bool BufferPool::Handle::pinned() const {
  return std::all_of(regions_.begin(), regions_.end(), [](const auto& r) { return r->pinned(); });
}

void BufferPool::give_back(Buffer* buffer) {
  {
    std::lock_guard lock(mutex_);
    buffer->leased = false;
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
         std::all_of(all_.begin(), all_.end(), [](const auto& b) { return b->storage->pinned(); });
}

}  // namespace draftfeed
