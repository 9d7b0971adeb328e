// A bounds-checked reader for the flatbuffers binary format, enough for Arrow IPC metadata.
//
// Arrow's Message/Schema/RecordBatch headers are flatbuffers; Arrow C++ is not packaged for this
// platform, so draftfeed reads them by hand. The bytes are untrusted: every offset is checked
// against the buffer with 64-bit arithmetic before it is followed, and a bad one throws
// Error(kFormat) naming `what` (the file and message) and the numbers that disagree.
//
// Layout facts used (flatbuffers binary format): a buffer starts with a uint32 offset to the root
// table; a table starts with an int32 `soffset`, and its vtable sits at `table - soffset`; a vtable
// is uint16 [vtable bytes, table bytes, field offsets...] where 0 means "absent, use the default";
// reference fields hold a uint32 offset relative to the field's own position; vectors and strings
// start with a uint32 element count. All little-endian, no alignment assumed (memcpy loads).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace draftfeed::fb {

class Table;
class Vector;

// The bytes of one flatbuffer plus a description for error messages.
class Buffer {
 public:
  Buffer(std::span<const std::uint8_t> bytes, const std::string* what)
      : bytes_(bytes), what_(what) {}

  // The root table (uint32 offset at position 0).
  Table root() const;
  // Throws Error(kFormat) unless [pos, pos + size) lies inside the buffer.
  void check_range(std::uint64_t pos, std::uint64_t size, const char* object) const;
  [[noreturn]] void fail(const std::string& problem) const;

  template <typename T>
  T load(std::uint64_t pos) const {
    check_range(pos, sizeof(T), "scalar");
    T value;
    std::memcpy(&value, bytes_.data() + pos, sizeof(T));
    return value;
  }
  std::size_t size() const { return bytes_.size(); }
  const std::uint8_t* data() const { return bytes_.data(); }
  const std::string& what() const { return *what_; }

  // Follows the uint32 offset stored at `pos` and returns the absolute target position.
  std::uint64_t follow(std::uint64_t pos) const;
  // The table whose start is at `pos` (validates the vtable).
  Table table_at(std::uint64_t pos) const;
  // The vector whose length word is at `pos`, with `element_size`-byte elements.
  Vector vector_at(std::uint64_t pos, std::uint32_t element_size) const;

 private:
  std::span<const std::uint8_t> bytes_;
  const std::string* what_;
};

class Table {
 public:
  Table() = default;
  Table(const Buffer* buffer, std::uint64_t pos, std::uint64_t vtable, std::uint16_t vtable_size,
        std::uint16_t table_size)
      : buffer_(buffer),
        pos_(pos),
        vtable_(vtable),
        vtable_size_(vtable_size),
        table_size_(table_size) {}

  bool has(int slot) const { return field_offset(slot) != 0; }

  template <typename T>
  T scalar(int slot, T fallback) const {
    const std::uint16_t offset = field_offset(slot, sizeof(T));
    return offset == 0 ? fallback : buffer_->load<T>(pos_ + offset);
  }
  // A sub-table, vector or string; absent fields give `false` / empty results.
  bool table(int slot, Table* out) const;
  bool vector(int slot, std::uint32_t element_size, Vector* out) const;
  bool string(int slot, std::string_view* out) const;

  const Buffer& buffer() const { return *buffer_; }

 private:
  // The field's offset inside the table (0 if absent); checks that `size` bytes fit in the table.
  std::uint16_t field_offset(int slot, std::uint32_t size = 4) const;

  const Buffer* buffer_ = nullptr;
  std::uint64_t pos_ = 0;
  std::uint64_t vtable_ = 0;
  std::uint16_t vtable_size_ = 0;
  std::uint16_t table_size_ = 0;
};

class Vector {
 public:
  Vector() = default;
  Vector(const Buffer* buffer, std::uint64_t data, std::uint32_t length, std::uint32_t element_size)
      : buffer_(buffer), data_(data), length_(length), element_size_(element_size) {}

  std::uint32_t size() const { return length_; }
  // Absolute position of element i (i < size(), checked by the caller's loop bound).
  std::uint64_t element(std::uint32_t i) const {
    return data_ + static_cast<std::uint64_t>(i) * element_size_;
  }
  template <typename T>
  T scalar(std::uint32_t i, std::uint32_t byte_offset = 0) const {
    return buffer_->load<T>(element(i) + byte_offset);
  }
  Table table(std::uint32_t i) const;
  std::string_view string(std::uint32_t i) const;

 private:
  const Buffer* buffer_ = nullptr;
  std::uint64_t data_ = 0;
  std::uint32_t length_ = 0;
  std::uint32_t element_size_ = 0;
};

}  // namespace draftfeed::fb
