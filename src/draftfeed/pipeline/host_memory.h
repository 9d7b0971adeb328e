// Batch memory: page-aligned host allocations, page-locked ("pinned") through the CUDA runtime when
// one is present at run time. The runtime is loaded with dlopen, so draftfeed needs no CUDA to
// build or run; `DRAFTFEED_CUDART` may name the library to load (tests point it at a stand-in).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace draftfeed {

class HostBuffer {
 public:
  // Allocates `bytes` (page-aligned, zero-filled). Tries to pin when `try_pin`.
  HostBuffer(std::size_t bytes, bool try_pin);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool pinned() const { return pinned_; }

 private:
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool pinned_ = false;
};

// Whether a CUDA runtime could be loaded (and why not), for the loader's summary.
struct PinningSupport {
  bool available = false;
  std::string detail;  // library loaded, or the reason pinning is off
};
PinningSupport pinning_support();

}  // namespace draftfeed
