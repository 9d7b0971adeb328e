#include "draftfeed/dataset/flatbuffer_reader.h"

#include "draftfeed/common/error.h"

namespace draftfeed::fb {

void Buffer::fail(const std::string& problem) const {
  throw Error(ErrorKind::kFormat, *what_ + ": corrupt flatbuffer metadata: " + problem);
}

void Buffer::check_range(std::uint64_t pos, std::uint64_t size, const char* object) const {
  // Both operands are below 2^63 in practice (positions come from uint32 offsets), but compare
  // without adding so no value can wrap.
  if (pos > bytes_.size() || size > bytes_.size() - pos) {
    fail(std::string(object) + " at byte " + std::to_string(pos) + " needs " +
         std::to_string(size) + " bytes but the metadata is " + std::to_string(bytes_.size()) +
         " bytes long");
  }
}

std::uint64_t Buffer::follow(std::uint64_t pos) const {
  const std::uint64_t target = pos + load<std::uint32_t>(pos);
  check_range(target, 0, "offset target");
  return target;
}

Table Buffer::root() const { return table_at(follow(0)); }

Table Buffer::table_at(std::uint64_t pos) const {
  const auto soffset = static_cast<std::int64_t>(load<std::int32_t>(pos));
  const std::int64_t vtable = static_cast<std::int64_t>(pos) - soffset;
  if (vtable < 0 || static_cast<std::uint64_t>(vtable) > bytes_.size()) {
    fail("table at byte " + std::to_string(pos) + " points to a vtable at " +
         std::to_string(vtable) + ", outside the " + std::to_string(bytes_.size()) + " bytes");
  }
  const auto vt = static_cast<std::uint64_t>(vtable);
  const auto vtable_size = load<std::uint16_t>(vt);
  const auto table_size = load<std::uint16_t>(vt + 2);
  if (vtable_size < 4 || vtable_size % 2 != 0) {
    fail("vtable at byte " + std::to_string(vt) + " has size " + std::to_string(vtable_size));
  }
  check_range(vt, vtable_size, "vtable");
  if (table_size < 4) {
    fail("table at byte " + std::to_string(pos) + " has size " + std::to_string(table_size));
  }
  check_range(pos, table_size, "table");
  return Table(this, pos, vt, vtable_size, table_size);
}

Vector Buffer::vector_at(std::uint64_t pos, std::uint32_t element_size) const {
  const auto length = load<std::uint32_t>(pos);
  check_range(pos + 4, static_cast<std::uint64_t>(length) * element_size, "vector");
  return Vector(this, pos + 4, length, element_size);
}

std::uint16_t Table::field_offset(int slot, std::uint32_t size) const {
  const std::uint64_t entry = 4 + 2 * static_cast<std::uint64_t>(slot);
  if (entry + 2 > vtable_size_) return 0;  // older writers omit trailing fields
  const auto offset = buffer_->load<std::uint16_t>(vtable_ + entry);
  if (offset == 0) return 0;
  if (offset < 4 || static_cast<std::uint32_t>(offset) + size > table_size_) {
    buffer_->fail("field " + std::to_string(slot) + " of the table at byte " +
                  std::to_string(pos_) + " sits at offset " + std::to_string(offset) +
                  ", past the table's " + std::to_string(table_size_) + " bytes");
  }
  return offset;
}

bool Table::table(int slot, Table* out) const {
  const std::uint16_t offset = field_offset(slot);
  if (offset == 0) return false;
  *out = buffer_->table_at(buffer_->follow(pos_ + offset));
  return true;
}

bool Table::vector(int slot, std::uint32_t element_size, Vector* out) const {
  const std::uint16_t offset = field_offset(slot);
  if (offset == 0) {
    *out = Vector();
    return false;
  }
  *out = buffer_->vector_at(buffer_->follow(pos_ + offset), element_size);
  return true;
}

bool Table::string(int slot, std::string_view* out) const {
  Vector bytes;
  if (!vector(slot, 1, &bytes)) {
    *out = {};
    return false;
  }
  *out = std::string_view(reinterpret_cast<const char*>(buffer_->data() + bytes.element(0)),
                          bytes.size());
  return true;
}

Table Vector::table(std::uint32_t i) const {
  return buffer_->table_at(buffer_->follow(element(i)));
}

std::string_view Vector::string(std::uint32_t i) const {
  const Vector bytes = buffer_->vector_at(buffer_->follow(element(i)), 1);
  return std::string_view(reinterpret_cast<const char*>(buffer_->data() + bytes.element(0)),
                          bytes.size());
}

}  // namespace draftfeed::fb
