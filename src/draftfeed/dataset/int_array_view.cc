
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/int_load.h"
#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {

namespace {

template <typename T>
void widen(const std::uint8_t* data, std::int64_t length, std::int64_t* out) {
  for (std::int64_t i = 0; i < length; ++i) {
    T value;
    std::memcpy(&value, data + i * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
    // T = std::int8_t is a number, widened with its sign; the option that ignores int8_t cannot
    // see the typedef through the template parameter.
    out[i] = static_cast<std::int64_t>(value);  // NOLINT(bugprone-signed-char-misuse)
  }
}

}  // namespace

std::int64_t IntArrayView::operator[](std::int64_t i) const {
  return load_int(data + i * byte_width, byte_width, is_signed);
}

void IntArrayView::copy_to(std::int64_t* out) const {
  // One loop per width so the compiler can vectorise the widening.
  switch (byte_width) {
    case 1:
      return is_signed ? widen<std::int8_t>(data, length, out)
                       : widen<std::uint8_t>(data, length, out);
    case 2:
      return is_signed ? widen<std::int16_t>(data, length, out)
                       : widen<std::uint16_t>(data, length, out);
    case 4:
      return is_signed ? widen<std::int32_t>(data, length, out)
                       : widen<std::uint32_t>(data, length, out);
    default:
      if (length > 0) std::memcpy(out, data, static_cast<std::size_t>(length) * 8);
  }
}

bool IntArrayView::guarded_copy_to(std::int64_t* out) const {
  return guard_mapped_reads([&] { copy_to(out); });
}

bool IntArrayView::holds(const void* address) const {
  const auto* at = static_cast<const std::uint8_t*>(address);
  return data != nullptr && at >= data && at < data + size_bytes();
}

Error unreadable_row(const IntArrayView& view, std::int64_t row, const char* column) {
  const std::string shard = view.shard != nullptr ? *view.shard + ": " : std::string();
  const std::string which = row >= 0 ? "row " + std::to_string(row) + ": its " : "the row's ";
  return Error(ErrorKind::kIo, shard + which + column +
                                   " could not be read: the shard shrank under the reader "
                                   "(truncated or rewritten by another process)");
}

bool IntArrayView::equals(std::span<const std::int64_t> values) const {
  if (static_cast<std::int64_t>(values.size()) != length) return false;
  for (std::int64_t i = 0; i < length; ++i) {
    if ((*this)[i] != values[static_cast<std::size_t>(i)]) return false;
  }
  return true;
}

}  // namespace draftfeed
