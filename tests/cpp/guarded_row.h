// A kernel's destination row with guard bytes on both sides, at an address 32-byte aligned
// (where the batch copy's kernels write with streaming stores, batch/vector_store.h) or one byte
// past it (where they store normally), so tests cover both store paths and catch any byte written
// outside the row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace draftfeed {

class GuardedRow {
 public:
  static constexpr std::uint8_t kGuard = 0xAB;
  static constexpr std::size_t kSlack = 64;

  GuardedRow(std::size_t bytes, bool aligned)
      : storage_(bytes + 2 * kSlack + 64, kGuard), bytes_(bytes) {
    const auto start = reinterpret_cast<std::uintptr_t>(storage_.data());
    const std::uintptr_t row = ((start + kSlack + 31) & ~std::uintptr_t{31}) + (aligned ? 0 : 1);
    offset_ = static_cast<std::size_t>(row - start);
  }

  std::uint8_t* data() { return storage_.data() + offset_; }
  const std::uint8_t* data() const { return storage_.data() + offset_; }

  // True when no byte outside the row was written.
  bool guards_intact() const {
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if ((i < offset_ || i >= offset_ + bytes_) && storage_[i] != kGuard) return false;
    }
    return true;
  }

 private:
  std::vector<std::uint8_t> storage_;
  std::size_t bytes_;
  std::size_t offset_ = 0;
};

}  // namespace draftfeed
