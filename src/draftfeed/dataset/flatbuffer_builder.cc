#include "draftfeed/dataset/flatbuffer_builder.h"

#include <algorithm>
#include <cassert>

namespace draftfeed::fb {

TableBuilder& TableBuilder::add_scalar(int slot, int size, std::uint64_t bits) {
  assert(size == 1 || size == 2 || size == 4 || size == 8);
  node_.slots.push_back({slot, size, bits, nullptr});
  return *this;
}

TableBuilder& TableBuilder::add_ref(int slot, NodeRef node) {
  node_.slots.push_back({slot, 0, 0, std::move(node)});
  return *this;
}

NodeRef TableBuilder::build() { return std::make_shared<const Node>(std::move(node_)); }

NodeRef make_string(const std::string& text) {
  Node node;
  node.kind = Node::Kind::kBytesVector;
  node.bytes = text;
  node.count = static_cast<std::uint32_t>(text.size());
  node.nul_terminated = true;
  return std::make_shared<const Node>(std::move(node));
}

NodeRef make_bytes_vector(std::string bytes, std::uint32_t count, std::uint32_t alignment) {
  Node node;
  node.kind = Node::Kind::kBytesVector;
  node.bytes = std::move(bytes);
  node.count = count;
  node.alignment = alignment;
  return std::make_shared<const Node>(std::move(node));
}

NodeRef make_table_vector(std::vector<NodeRef> tables) {
  Node node;
  node.kind = Node::Kind::kTableVector;
  node.elements = std::move(tables);
  return std::make_shared<const Node>(std::move(node));
}

namespace {

class Serializer {
 public:
  std::vector<std::uint8_t> run(const Node& root) {
    put(0, 4);  // the root offset, patched below
    patch(0, emit(root));
    pad_to(8);
    return std::move(out_);
  }

 private:
  void pad_to(std::size_t alignment) {
    while (out_.size() % alignment != 0) out_.push_back(0);
  }
  void put(std::uint64_t bits, int size) {
    for (int i = 0; i < size; ++i) out_.push_back(static_cast<std::uint8_t>(bits >> (8 * i)));
  }
  void put_at(std::size_t pos, std::uint64_t bits, int size) {
    for (int i = 0; i < size; ++i) out_[pos + i] = static_cast<std::uint8_t>(bits >> (8 * i));
  }
  // Stores at `pos` the uint32 offset from `pos` forward to `target`.
  void patch(std::size_t pos, std::size_t target) {
    assert(target > pos);
    put_at(pos, target - pos, 4);
  }

  std::size_t emit(const Node& node) {
    switch (node.kind) {
      case Node::Kind::kTable:
        return emit_table(node);
      case Node::Kind::kBytesVector:
        return emit_bytes(node);
      case Node::Kind::kTableVector:
        return emit_table_vector(node);
    }
    return 0;
  }

  std::size_t emit_table(const Node& node) {
    // Inline layout: the int32 soffset, then fields by descending size so each is aligned.
    std::vector<const Node::Slot*> order;
    int slot_count = 0;
    for (const auto& slot : node.slots) {
      order.push_back(&slot);
      slot_count = std::max(slot_count, slot.index + 1);
    }
    auto width = [](const Node::Slot* slot) { return slot->size == 0 ? 4 : slot->size; };
    std::stable_sort(order.begin(), order.end(),
                     [&](const auto* a, const auto* b) { return width(a) > width(b); });
    std::vector<std::uint16_t> field_offsets(static_cast<std::size_t>(slot_count), 0);
    std::size_t cursor = 4;
    for (const auto* slot : order) {
      const auto size = static_cast<std::size_t>(width(slot));
      cursor = (cursor + size - 1) / size * size;
      field_offsets[static_cast<std::size_t>(slot->index)] = static_cast<std::uint16_t>(cursor);
      cursor += size;
    }
    const std::size_t table_size = cursor;

    pad_to(2);
    const std::size_t vtable = out_.size();
    put(4 + 2 * static_cast<std::uint64_t>(slot_count), 2);
    put(table_size, 2);
    for (const auto offset : field_offsets) put(offset, 2);

    pad_to(8);  // 8-byte fields sit at multiples of 8 inside the table
    const std::size_t table = out_.size();
    put(table - vtable, 4);  // vtable = table - soffset
    out_.resize(table + table_size, 0);
    for (const auto& slot : node.slots) {
      if (slot.size != 0) {
        put_at(table + field_offsets[static_cast<std::size_t>(slot.index)], slot.bits, slot.size);
      }
    }
    for (const auto& slot : node.slots) {
      if (slot.size == 0) {
        const std::size_t field = table + field_offsets[static_cast<std::size_t>(slot.index)];
        patch(field, emit(*slot.ref));
      }
    }
    return table;
  }

  std::size_t emit_bytes(const Node& node) {
    const std::size_t alignment = std::max<std::size_t>(4, node.alignment);
    pad_to(4);
    while ((out_.size() + 4) % alignment != 0) put(0, 4);
    const std::size_t pos = out_.size();
    put(node.count, 4);
    out_.insert(out_.end(), node.bytes.begin(), node.bytes.end());
    if (node.nul_terminated) out_.push_back(0);
    return pos;
  }

  std::size_t emit_table_vector(const Node& node) {
    pad_to(4);
    const std::size_t pos = out_.size();
    put(node.elements.size(), 4);
    const std::size_t first = out_.size();
    out_.resize(first + 4 * node.elements.size(), 0);
    for (std::size_t i = 0; i < node.elements.size(); ++i) {
      patch(first + 4 * i, emit(*node.elements[i]));
    }
    return pos;
  }

  std::vector<std::uint8_t> out_;
};

}  // namespace

std::vector<std::uint8_t> finish(const NodeRef& root) { return Serializer().run(*root); }

}  // namespace draftfeed::fb
