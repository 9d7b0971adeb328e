// Memory a store reads into, registered with the store once: chunks of anonymous memory, each
// registered when it is added, never unregistered while the pool lives, carved into regions.
//
// A region is one sample's object (the native Mooncake transfer reads it there with
// batch_get_into); it returns to its chunk's free list when its last owner lets go (the batch copy
// is done), and the free space coalesces. The pool grows by a chunk when no free range fits (a
// chunk is `chunk_bytes`, or one sample's size when that is larger), so it holds at most what is
// held at once at its peak, rounded up to chunks: the regions of the samples the lookahead fetched
// ahead (within its byte budget) and of those being copied into batches. It never waits for a free
// region: a wait could hold the very fetch whose claim would free one.
//
// Thread safety: allocate() and stats() from any thread; a region may be released on any thread.
// `register_chunk` is called without the pool's lock held (it may take the GIL), one growth at a
// time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace draftfeed {

struct StagingStats {
  std::uint64_t registered_bytes = 0;  // the chunks' bytes, all registered with the store
  std::int64_t chunks = 0;
  std::uint64_t used_bytes = 0;  // in regions now
  std::uint64_t peak_used_bytes = 0;
  std::int64_t regions = 0;  // now
};

template <typename Visit>
void for_each_stat(const StagingStats& s, Visit&& visit) {
  visit("registered_bytes", s.registered_bytes);
  visit("chunks", s.chunks);
  visit("used_bytes", s.used_bytes);
  visit("peak_used_bytes", s.peak_used_bytes);
  visit("regions", s.regions);
}

// `size` bytes at `data`, 64-byte aligned, inside one registered chunk.
class StagingRegion {
 public:
  virtual ~StagingRegion() = default;
  std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return size_; }

 protected:
  StagingRegion(std::uint8_t* data, std::uint64_t size) : data_(data), size_(size) {}

 private:
  std::uint8_t* data_;
  std::uint64_t size_;
};

class StagingPool {
 public:
  static constexpr std::uint64_t kAlignment = 64;
  // Registers a new chunk with the store; throws Error when the store refuses.
  using RegisterChunk = std::function<void(std::uint8_t* address, std::uint64_t size)>;

  StagingPool(std::uint64_t chunk_bytes, RegisterChunk register_chunk);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A region of at least `size` bytes (size 0 gives a region of kAlignment). Throws Error(kIo) when
  // the OS has no memory for a new chunk, or what register_chunk threw.
  std::shared_ptr<StagingRegion> allocate(std::uint64_t size);
  StagingStats stats() const;

  struct State;  // the chunks and their free lists (staging_pool.cc)

 private:
  std::shared_ptr<State> state_;  // shared with the regions: chunks outlive the pool while held
  std::uint64_t chunk_bytes_;
  RegisterChunk register_chunk_;
  std::mutex growth_;  // one new chunk at a time
};

}  // namespace draftfeed
