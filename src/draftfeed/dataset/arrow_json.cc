#include "draftfeed/dataset/arrow_json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/int_load.h"
#include "draftfeed/common/json_escape.h"

namespace draftfeed::arrow {

namespace {

// ---------------------------------------------------------------------------------------------
// JSON text of scalars

// Python's float repr: the shortest digits that read back as `v`, in fixed notation when the
// decimal exponent is in [-4, 16) (always with a fractional part, "1.0"), else in scientific
// notation with at least two exponent digits ("1e+16", "1.5e-07"), which is also what
// std::to_chars writes in scientific form.
void append_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<std::size_t>(result.ptr - buf));
  const std::size_t e = sci.find('e');
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  if (exponent < -4 || exponent >= 16) {
    out += sci;
    return;
  }
  std::string_view mantissa = sci.substr(0, e);
  if (mantissa.front() == '-') {
    out += '-';
    mantissa.remove_prefix(1);
  }
  std::string digits;  // the significant digits without the point
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  if (exponent < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exponent - 1), '0');
    out += digits;
    return;
  }
  const auto whole = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= whole) {
    out += digits;
    out.append(whole - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, whole);
    out += '.';
    out.append(digits, whole);
  }
}

// IEEE 754 binary16 to double (exact: every half is a double).
double half_to_double(std::uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exponent = (h >> 10) & 0x1f;
  const int fraction = h & 0x3ff;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(fraction), -24);
  } else if (exponent == 31) {
    magnitude = fraction == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(static_cast<double>(fraction + 1024), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

template <typename T>
void append_integer(std::string& out, T v) {
  char buf[24];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, result.ptr);
}

// Length of the valid UTF-8 sequence starting at s[0] (strict: no overlong forms, no surrogates,
// nothing past U+10FFFF), or 0 when it is not valid.
std::size_t utf8_sequence_length(std::span<const std::uint8_t> s) {
  const std::uint8_t lead = s[0];
  std::size_t length;
  std::uint8_t low = 0x80, high = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (s.size() < length || s[1] < low || s[1] > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (s[k] < 0x80 || s[k] > 0xbf) return 0;
  }
  return length;
}

// Appends `text` as a JSON string. Returns the offset of the first invalid UTF-8 byte, or -1.
std::int64_t append_json_string(std::string& out, std::span<const std::uint8_t> text) {
  out += '"';
  std::size_t i = 0;
  while (i < text.size()) {
    const std::uint8_t c = text[i];
    if (c >= 0x80) {
      const std::size_t length = utf8_sequence_length(text.subspan(i));
      if (length == 0) return static_cast<std::int64_t>(i);
      out.append(reinterpret_cast<const char*>(text.data() + i), length);
      i += length;
      continue;
    }
    append_json_escaped(out, c);
    ++i;
  }
  out += '"';
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Types

// Bytes per value of a FloatingPoint field. The precision is kept only in the type text, which the
// schema reader spells "halffloat", "float" or "double".
int float_width(const Field& field) {
  if (field.type == "halffloat") return 2;
  if (field.type == "float") return 4;
  return 8;
}

// The list size of a fixed_size_list, from the "[N]" that ends its type text; -1 if absent.
std::int64_t fixed_list_size(const Field& field) {
  const std::string& type = field.type;
  const std::size_t open = type.rfind('[');
  if (type.empty() || type.back() != ']' || open == std::string::npos) return -1;
  std::int64_t size = -1;
  const auto [ptr, ec] =
      std::from_chars(type.data() + open + 1, type.data() + type.size() - 1, size);
  if (ec != std::errc() || ptr != type.data() + type.size() - 1) return -1;
  return size;
}

int buffers_needed(const Field& field) {
  switch (field.type_id) {
    case TypeId::kNull:
      return 0;
    case TypeId::kStruct:
    case TypeId::kFixedSizeList:
      return 1;
    case TypeId::kUtf8:
    case TypeId::kLargeUtf8:
      return 3;
    default:
      return 2;
  }
}

bool representable(const Field& field) {
  if (field.dictionary_encoded) return false;
  switch (field.type_id) {
    case TypeId::kNull:
    case TypeId::kInt:
    case TypeId::kFloatingPoint:
    case TypeId::kUtf8:
    case TypeId::kLargeUtf8:
    case TypeId::kBool:
    case TypeId::kList:
    case TypeId::kLargeList:
    case TypeId::kStruct:
      return true;
    case TypeId::kFixedSizeList:
      return fixed_list_size(field) >= 0;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// The walk

class ValueWriter {
 public:
  ValueWriter(const Field& column, const std::string& where, const JsonLimits& limits)
      : column_(column), where_(where), limits_(limits) {}

  // Refuses the column before any data is read when a type in it has no JSON form, or it nests
  // deeper than the limit (which then also bounds the recursion of `value`).
  void check_type(const Field& field, int depth) {
    if (depth > limits_.max_depth) {
      fail(ErrorKind::kUnsupported, "the type nests deeper than " +
                                        std::to_string(limits_.max_depth) + " levels (the limit)");
    }
    if (!representable(field)) {
      fail(ErrorKind::kUnsupported,
           "has type " + field.type +
               ", which has no JSON form draftfeed can produce (it reads struct, list, "
               "large_list, fixed_size_list, string, large_string, bool, integers, floats and "
               "null)");
    }
    for (std::size_t c = 0; c < field.children.size(); ++c) {
      steps_.push_back({&field.children[c].name});
      check_type(field.children[c], depth + 1);
      steps_.pop_back();
    }
  }

  void value(const Field& field, const ArrayView& array, std::int64_t i) {
    if (i < 0 || i >= array.length) {
      fail(ErrorKind::kFormat, "element " + std::to_string(i) + " is outside its array of " +
                                   std::to_string(array.length));
    }
    if (static_cast<int>(array.buffers.size()) < buffers_needed(field)) {
      fail(ErrorKind::kFormat, "the array has " + std::to_string(array.buffers.size()) +
                                   " buffers, its type needs " +
                                   std::to_string(buffers_needed(field)));
    }
    if (field.type_id == TypeId::kNull || is_null(array, i)) {
      append("null");
      return;
    }
    switch (field.type_id) {
      case TypeId::kStruct:
        return struct_value(field, array, i);
      case TypeId::kList:
      case TypeId::kLargeList: {
        const auto [begin, end] = offsets(array, i, field.type_id == TypeId::kList ? 4 : 8,
                                          child_of(field, array).length, "list");
        return list_value(field, array, begin, end);
      }
      case TypeId::kFixedSizeList:
        return fixed_list_value(field, array, i);
      case TypeId::kUtf8:
      case TypeId::kLargeUtf8:
        return string_value(field, array, i);
      case TypeId::kBool:
        return append((bit(array.buffers[1], i, "values") ? "true" : "false"));
      case TypeId::kInt:
        return int_value(field, array, i);
      case TypeId::kFloatingPoint:
        return float_value(field, array, i);
      default:
        fail(ErrorKind::kUnsupported, "has type " + field.type);  // check_type refused it already
    }
  }

  std::string& text() { return out_; }

 private:
  struct Step {
    const std::string* name;   // a struct field's name, or null for a list element
    std::int64_t element = 0;  // the list element's index
  };

  [[noreturn]] void fail(ErrorKind kind, const std::string& problem) const {
    std::string path = column_.name;
    // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "literal" + std::string&&.
    for (const auto& step : steps_) {
      if (step.name) {
        path += '.';
        path += *step.name;
      } else {
        path += '[';
        path += std::to_string(step.element);
        path += ']';
      }
    }
    throw Error(kind, where_ + ": column '" + column_.name + "' (type " + column_.type + "), " +
                          path + ": " + problem);
  }

  void check_size() const {
    if (out_.size() > limits_.max_bytes) too_large();
  }

  // Bytes still allowed before the limit.
  std::size_t room() const {
    return out_.size() >= limits_.max_bytes ? 0 : limits_.max_bytes - out_.size();
  }

  [[noreturn]] void too_large() const {
    fail(ErrorKind::kUnsupported, "the value's JSON text is larger than " +
                                      std::to_string(limits_.max_bytes) + " bytes (the limit)");
  }

  void append(std::string_view text) {
    out_ += text;
    check_size();
  }

  // Bit `i` of a bitmap, checked against its length.
  bool bit(std::span<const std::uint8_t> bitmap, std::int64_t i, const char* what) const {
    const auto byte = static_cast<std::uint64_t>(i) >> 3;
    if (byte >= bitmap.size()) {
      fail(ErrorKind::kFormat, std::string("the ") + what + " bitmap has " +
                                   std::to_string(bitmap.size()) +
                                   " bytes, too short for element " + std::to_string(i));
    }
    std::uint8_t bits = 0;
    read(&bits, bitmap.data() + byte, 1);
    return (bits >> (i & 7)) & 1;
  }

  // Copies `size` bytes of the array's buffers out under the fault guard: the buffers lie in a
  // mapped shard, which a process truncating the file shrinks under the walk, and the walk
  // allocates as it goes, so every read of the buffers is a guarded copy (of the walk's one
  // scope: no system call per element).
  void read(void* out, const std::uint8_t* from, std::size_t size) const {
    if (!reads_.copy(out, from, size)) {
      fail(ErrorKind::kIo,
           "the shard shrank while the value was read (truncated or rewritten by another "
           "process)");
    }
  }

  // Arrow C++ ignores the validity bitmap of an array whose null count is 0, so pyarrow (and thus
  // the reference) sees every element as valid then, whatever the bitmap says.
  bool is_null(const ArrayView& array, std::int64_t i) const {
    if (array.null_count == 0) return false;
    if (array.buffers[0].empty()) {
      fail(ErrorKind::kFormat,
           "the array has " + std::to_string(array.null_count) + " nulls but no validity bitmap");
    }
    return !bit(array.buffers[0], i, "validity");
  }

  const ArrayView& child_of(const Field& field, const ArrayView& array) const {
    if (array.children.size() != field.children.size()) {
      fail(ErrorKind::kFormat, "the array has " + std::to_string(array.children.size()) +
                                   " child arrays, its type has " +
                                   std::to_string(field.children.size()));
    }
    return array.children[0];
  }

  // Offsets i and i + 1 of buffers[1], of `width` bytes; both must lie in [0, limit] and not
  // decrease.
  std::pair<std::int64_t, std::int64_t> offsets(const ArrayView& array, std::int64_t i, int width,
                                                std::int64_t limit, const char* what) const {
    const std::span<const std::uint8_t> buffer = array.buffers[1];
    if (static_cast<std::uint64_t>(i) + 2 > buffer.size() / static_cast<std::size_t>(width)) {
      fail(ErrorKind::kFormat, std::string("the ") + what + " offsets buffer has " +
                                   std::to_string(buffer.size()) +
                                   " bytes, too short for element " + std::to_string(i));
    }
    std::uint8_t pair[16];
    read(pair, buffer.data() + static_cast<std::size_t>(i) * width,
         2 * static_cast<std::size_t>(width));
    const std::int64_t begin = load_int(pair, static_cast<std::uint8_t>(width), true);
    const std::int64_t end = load_int(pair + width, static_cast<std::uint8_t>(width), true);
    if (begin < 0 || end < begin || end > limit) {
      fail(ErrorKind::kFormat, std::string("the ") + what + " offsets of element " +
                                   std::to_string(i) + " are [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + "), not a range inside [0, " +
                                   std::to_string(limit) + ")");
    }
    return {begin, end};
  }

  void struct_value(const Field& field, const ArrayView& array, std::int64_t i) {
    if (array.children.size() != field.children.size()) child_of(field, array);  // fails
    append("{");
    for (std::size_t c = 0; c < field.children.size(); ++c) {
      if (c > 0) out_ += ',';
      const std::string& name = field.children[c].name;
      steps_.push_back({&name});
      // Field names come from the untrusted schema too.
      if (append_json_string(
              out_, {reinterpret_cast<const std::uint8_t*>(name.data()), name.size()}) >= 0) {
        fail(ErrorKind::kFormat, "the field name is not valid UTF-8");
      }
      out_ += ':';
      value(field.children[c], array.children[c], i);
      steps_.pop_back();
    }
    append("}");
  }

  // Elements [begin, end) of the list's child array.
  void list_value(const Field& field, const ArrayView& array, std::int64_t begin,
                  std::int64_t end) {
    const ArrayView& child = child_of(field, array);
    append("[");
    for (std::int64_t k = begin; k < end; ++k) {
      if (k > begin) out_ += ',';
      steps_.push_back({nullptr, k - begin});
      value(field.children[0], child, k);
      steps_.pop_back();
    }
    append("]");
  }

  void fixed_list_value(const Field& field, const ArrayView& array, std::int64_t i) {
    const std::int64_t size = fixed_list_size(field);
    const std::int64_t available = child_of(field, array).length;
    // (i + 1) * size <= available, without overflow.
    if (size > 0 && i >= available / size) {
      fail(ErrorKind::kFormat, "element " + std::to_string(i) + " of lists of " +
                                   std::to_string(size) + " needs more than the " +
                                   std::to_string(available) + " values of the child array");
    }
    list_value(field, array, i * size, i * size + size);
  }

  void string_value(const Field& field, const ArrayView& array, std::int64_t i) {
    const std::span<const std::uint8_t> data = array.buffers[2];
    const auto limit = static_cast<std::int64_t>(data.size());
    const auto [begin, end] =
        offsets(array, i, field.type_id == TypeId::kUtf8 ? 4 : 8, limit, "string");
    // Escaping never shrinks text, so a string that cannot fit is refused before it is copied.
    if (static_cast<std::uint64_t>(end - begin) > room()) too_large();
    text_.resize(static_cast<std::size_t>(end - begin));
    read(text_.data(), data.data() + begin, text_.size());
    const std::span<const std::uint8_t> text(text_);
    const std::int64_t bad = append_json_string(out_, text);
    if (bad >= 0) {
      fail(ErrorKind::kFormat, "the string is not valid UTF-8 (byte " + std::to_string(bad) +
                                   " of its " + std::to_string(text.size()) + ")");
    }
    check_size();
  }

  void int_value(const Field& field, const ArrayView& array, std::int64_t i) {
    std::uint8_t p[8];
    read(p, element(array, i, field.bit_width / 8), static_cast<std::size_t>(field.bit_width / 8));
    if (field.bit_width == 64 && !field.is_signed) {
      std::uint64_t v;
      std::memcpy(&v, p, 8);
      append_integer(out_, v);
    } else {
      append_integer(out_,
                     load_int(p, static_cast<std::uint8_t>(field.bit_width / 8), field.is_signed));
    }
    check_size();
  }

  void float_value(const Field& field, const ArrayView& array, std::int64_t i) {
    const int width = float_width(field);
    std::uint8_t p[8];
    read(p, element(array, i, width), static_cast<std::size_t>(width));
    double v;
    if (width == 2) {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      v = half_to_double(h);
    } else if (width == 4) {
      float f;
      std::memcpy(&f, p, 4);
      v = f;  // pyarrow hands Python the float widened to a double
    } else {
      std::memcpy(&v, p, 8);
    }
    append_double(out_, v);
    check_size();
  }

  // Element `i` of a fixed-width values buffer (buffers[1]), checked against its length.
  const std::uint8_t* element(const ArrayView& array, std::int64_t i, int width) const {
    const std::span<const std::uint8_t> values = array.buffers[1];
    if (width <= 0 ||
        static_cast<std::uint64_t>(i) >= values.size() / static_cast<std::size_t>(width)) {
      fail(ErrorKind::kFormat, "the values buffer has " + std::to_string(values.size()) +
                                   " bytes, too short for element " + std::to_string(i) + " of " +
                                   std::to_string(width) + " bytes");
    }
    return values.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(width);
  }

  const Field& column_;
  const std::string& where_;
  JsonLimits limits_;
  std::vector<Step> steps_;
  std::string out_;
  std::vector<std::uint8_t> text_;  // a string's bytes, copied out of the array
  MappedReadScope reads_;           // the guards of every read of the arrays' buffers
};

}  // namespace

Result<std::string> arrow_value_json(const Field& field, const ArrayView& array, std::int64_t index,
                                     const std::string& where, const JsonLimits& limits) {
  if (index < 0 || index >= array.length) {
    return Error(ErrorKind::kInvalidArgument,
                 where + ": column '" + field.name + "': element " + std::to_string(index) +
                     " requested from an array of " + std::to_string(array.length));
  }
  try {
    ValueWriter writer(field, where, limits);
    writer.check_type(field, 0);
    writer.value(field, array, index);
    return std::move(writer.text());
  } catch (const Error& error) {
    return error;
  }
}

}  // namespace draftfeed::arrow
