#include "draftfeed/source/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>
#include <vector>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

constexpr std::uint64_t kChunkGranule = std::uint64_t{2} << 20;

std::uint64_t round_up(std::uint64_t value, std::uint64_t to) { return (value + to - 1) / to * to; }

}  // namespace

struct StagingPool::State {
  struct Chunk {
    std::uint8_t* base = nullptr;
    std::uint64_t size = 0;
    std::map<std::uint64_t, std::uint64_t> free;  // offset -> length, coalesced
  };
  std::mutex mutex;
  std::vector<Chunk> chunks;  // guarded by mutex; never shrinks (regions name chunks by index)
  StagingStats stats;

  ~State() {
    for (const Chunk& chunk : chunks) munmap(chunk.base, chunk.size);
  }

  // A free range of `size` bytes in some chunk, taken; null when none fits. Lock held.
  std::uint8_t* take(std::uint64_t size, std::size_t& chunk_index, std::uint64_t& offset) {
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      auto& free = chunks[c].free;
      for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->second < size) continue;
        offset = it->first;
        const std::uint64_t rest = it->second - size;
        free.erase(it);
        if (rest > 0) free.emplace(offset + size, rest);
        chunk_index = c;
        stats.used_bytes += size;
        stats.peak_used_bytes = std::max(stats.peak_used_bytes, stats.used_bytes);
        ++stats.regions;
        return chunks[c].base + offset;
      }
    }
    return nullptr;
  }

  // Returns a range to its chunk, merged with its free neighbours. Lock held.
  void give_back(std::size_t chunk_index, std::uint64_t offset, std::uint64_t size) {
    auto& free = chunks[chunk_index].free;
    auto next = free.lower_bound(offset);
    if (next != free.end() && offset + size == next->first) {
      size += next->second;
      next = free.erase(next);
    }
    if (next != free.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == offset) {
        before->second += size;
        size = 0;
      }
    }
    if (size > 0) free.emplace(offset, size);
  }
};

namespace {

class PooledRegion : public StagingRegion {
 public:
  PooledRegion(std::shared_ptr<StagingPool::State> state, std::size_t chunk, std::uint64_t offset,
               std::uint8_t* data, std::uint64_t size)
      : StagingRegion(data, size), state_(std::move(state)), chunk_(chunk), offset_(offset) {}
  ~PooledRegion() override {
    std::lock_guard lock(state_->mutex);
    state_->give_back(chunk_, offset_, size());
    state_->stats.used_bytes -= size();
    --state_->stats.regions;
  }
  PooledRegion(const PooledRegion&) = delete;
  PooledRegion& operator=(const PooledRegion&) = delete;

 private:
  std::shared_ptr<StagingPool::State> state_;
  std::size_t chunk_;
  std::uint64_t offset_;
};

}  // namespace

StagingPool::StagingPool(std::uint64_t chunk_bytes, RegisterChunk register_chunk)
    : state_(std::make_shared<State>()),
      chunk_bytes_(round_up(std::max<std::uint64_t>(chunk_bytes, 1), kChunkGranule)),
      register_chunk_(std::move(register_chunk)) {}

StagingPool::~StagingPool() = default;

std::shared_ptr<StagingRegion> StagingPool::allocate(std::uint64_t size) {
  const std::uint64_t need = round_up(std::max<std::uint64_t>(size, 1), kAlignment);
  std::size_t chunk = 0;
  std::uint64_t offset = 0;
  {
    std::lock_guard lock(state_->mutex);
    if (std::uint8_t* data = state_->take(need, chunk, offset)) {
      return std::make_shared<PooledRegion>(state_, chunk, offset, data, need);
    }
  }
  std::lock_guard growing(growth_);
  {
    // Another thread may have grown the pool meanwhile, or regions gone back.
    std::lock_guard lock(state_->mutex);
    if (std::uint8_t* data = state_->take(need, chunk, offset)) {
      return std::make_shared<PooledRegion>(state_, chunk, offset, data, need);
    }
  }
  const std::uint64_t bytes = round_up(std::max(need, chunk_bytes_), kChunkGranule);
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    throw Error(ErrorKind::kIo, "staging memory for store reads: cannot map " +
                                    std::to_string(bytes) + " bytes: " + os_error_text(errno));
  }
  auto* base = static_cast<std::uint8_t*>(memory);
  try {
    register_chunk_(base, bytes);
  } catch (...) {
    munmap(base, bytes);
    throw;
  }
  std::lock_guard lock(state_->mutex);
  State::Chunk added;
  added.base = base;
  added.size = bytes;
  added.free.emplace(0, bytes);
  state_->chunks.push_back(std::move(added));
  state_->stats.registered_bytes += bytes;
  ++state_->stats.chunks;
  std::uint8_t* data = state_->take(need, chunk, offset);
  return std::make_shared<PooledRegion>(state_, chunk, offset, data, need);
}

StagingStats StagingPool::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

}  // namespace draftfeed
