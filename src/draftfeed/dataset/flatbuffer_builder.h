// A minimal flatbuffers writer, enough for the Arrow IPC messages draftfeed writes.
//
// The caller describes the objects as a small tree (tables, strings, vectors); `finish` lays it
// out front to back: every object is written before the objects it references, so each uint32
// reference offset is positive, as the format requires. Scalars are aligned to their size relative
// to the buffer's start (the flatbuffers verifier in Arrow C++ checks that), and the result's
// length is a multiple of 8.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace draftfeed::fb {

struct Node;
using NodeRef = std::shared_ptr<const Node>;

struct Node {
  enum class Kind { kTable, kBytesVector, kTableVector };
  struct Slot {
    int index = 0;
    int size = 0;            // 1, 2, 4 or 8 for scalars; 0 for a reference to `ref`
    std::uint64_t bits = 0;  // the scalar's little-endian bits
    NodeRef ref;
  };
  Kind kind = Kind::kTable;
  std::vector<Slot> slots;      // kTable
  std::string bytes;            // kBytesVector: the elements' raw bytes (a string: its characters)
  std::uint32_t count = 0;      // kBytesVector: number of elements
  std::uint32_t alignment = 1;  // kBytesVector: the elements' alignment
  bool nul_terminated = false;  // kBytesVector holding a string
  std::vector<NodeRef> elements;  // kTableVector
};

// Builders for the tree.
class TableBuilder {
 public:
  TableBuilder& add_scalar(int slot, int size, std::uint64_t bits);
  TableBuilder& add_bool(int slot, bool value) { return add_scalar(slot, 1, value ? 1 : 0); }
  TableBuilder& add_u8(int slot, std::uint8_t value) { return add_scalar(slot, 1, value); }
  TableBuilder& add_i16(int slot, std::int16_t value) {
    return add_scalar(slot, 2, static_cast<std::uint16_t>(value));
  }
  TableBuilder& add_i32(int slot, std::int32_t value) {
    return add_scalar(slot, 4, static_cast<std::uint32_t>(value));
  }
  TableBuilder& add_i64(int slot, std::int64_t value) {
    return add_scalar(slot, 8, static_cast<std::uint64_t>(value));
  }
  TableBuilder& add_ref(int slot, NodeRef node);
  NodeRef build();

 private:
  Node node_;
};

NodeRef make_string(const std::string& text);
// A vector of fixed-size structs or scalars: `count` elements whose bytes are `bytes`.
NodeRef make_bytes_vector(std::string bytes, std::uint32_t count, std::uint32_t alignment);
NodeRef make_table_vector(std::vector<NodeRef> tables);

// Serializes the tree rooted at the table `root`.
std::vector<std::uint8_t> finish(const NodeRef& root);

}  // namespace draftfeed::fb
