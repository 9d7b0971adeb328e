// A buffer a copying thread keeps and reuses (thread_local): slices staged on their way into a
// batch stay in the core's cache, and no copy allocates once the buffer has grown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace draftfeed {

class ThreadBuffer {
 public:
  // The buffer, grown to at least `bytes` (64-byte aligned for the kernels' loads).
  std::uint8_t* at_least(std::size_t bytes) {
    if (capacity_ < bytes) {
      const std::size_t size = (bytes + 63) / 64 * 64;
      buffer_.reset(static_cast<std::uint8_t*>(std::aligned_alloc(64, size)));
      if (!buffer_) throw std::bad_alloc();
      capacity_ = size;
    }
    return buffer_.get();
  }

 private:
  struct FreeDeleter {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, FreeDeleter> buffer_;
  std::size_t capacity_ = 0;
};

}  // namespace draftfeed
