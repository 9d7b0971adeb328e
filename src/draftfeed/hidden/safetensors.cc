#include "draftfeed/hidden/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/json_depth.h"
#include "draftfeed/common/printable.h"

namespace draftfeed {

namespace {

using json = nlohmann::json;

// A tensor entry as the header states it, before its offsets are checked against the buffer.
struct TensorEntry {
  std::string name;
  std::optional<DType> dtype;
  std::optional<std::vector<std::int64_t>> shape;
  std::optional<std::vector<std::uint64_t>> offsets;
};

std::string backticked(const std::string& name) { return "`" + name + "`"; }

// Builds the header's tensors and metadata from SAX events, refusing anything the format forbids
// as soon as it is seen. The first error is kept in `error` and stops the parse.
class HeaderHandler : public nlohmann::json_sax<json> {
 public:
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;
  std::string error;

  bool null() override { return scalar("null"); }
  bool boolean(bool /*value*/) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t value) override {
    if (value >= 0) return number_unsigned(static_cast<number_unsigned_t>(value));
    return scalar("the negative number " + std::to_string(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (skip_depth_ > 0) return true;
    if (state_ == State::kShape) {
      if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return fail("tensor " + backticked(current().name) + " has a dimension " +
                    std::to_string(value) + " larger than 2^63-1");
      }
      current().shape->push_back(static_cast<std::int64_t>(value));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (current().offsets->size() >= 2) {
        return fail("tensor " + backticked(current().name) + " has more than 2 data_offsets");
      }
      current().offsets->push_back(value);
      return true;
    }
    return scalar("a number");
  }
  bool number_float(number_float_t /*value*/, const string_t& text) override {
    return scalar("the non-integer number " + text);
  }
  bool binary(binary_t& /*value*/) override { return scalar("binary data"); }

  bool string(string_t& value) override {
    if (skip_depth_ > 0) return true;
    if (state_ == State::kMetadataValue) {
      metadata.emplace(pending_key_, value);
      state_ = State::kMetadata;
      return true;
    }
    if (state_ == State::kTensorValue && pending_key_ == "dtype") {
      const auto dtype = dtype_from_name(value);
      if (!dtype) {
        return fail("tensor " + backticked(current().name) + " has the unknown dtype '" + value +
                    "'");
      }
      current().dtype = dtype;
      state_ = State::kTensor;
      return true;
    }
    return scalar("the string \"" + value + "\"");
  }

  bool start_object(std::size_t /*elements*/) override {
    if (skipping_container()) return true;
    switch (state_) {
      case State::kStart:
        state_ = State::kRoot;
        return true;
      case State::kRootValue:
        if (pending_key_ == "__metadata__") {
          has_metadata = true;
          state_ = State::kMetadata;
        } else {
          tensors.push_back(TensorEntry{pending_key_, {}, {}, {}});
          state_ = State::kTensor;
        }
        seen_fields_.clear();
        return true;
      default:
        return unexpected("an object");
    }
  }

  bool key(string_t& value) override {
    if (skip_depth_ > 0) return true;
    if (state_ == State::kRoot) {
      if (!seen_names_.insert(value).second) {
        return fail(value == "__metadata__"
                        ? "the key `__metadata__` appears twice"
                        : "the tensor name " + backticked(value) + " appears twice");
      }
      pending_key_ = value;
      state_ = State::kRootValue;
      return true;
    }
    if (!seen_fields_.insert(value).second) {
      return fail(state_ == State::kMetadata
                      ? "the metadata key " + backticked(value) + " appears twice"
                      : "tensor " + backticked(current().name) + " has the field " +
                            backticked(value) + " twice");
    }
    pending_key_ = value;
    if (state_ == State::kMetadata) {
      state_ = State::kMetadataValue;
    } else {
      state_ = State::kTensorValue;
      if (value != "dtype" && value != "shape" && value != "data_offsets") {
        skip_next_ = true;  // an extra field: ignored, whatever its value
      }
    }
    return true;
  }

  bool end_object() override {
    if (skip_depth_ > 0) {
      if (--skip_depth_ == 0) state_ = State::kTensor;
      return true;
    }
    if (state_ == State::kTensor) {
      const TensorEntry& entry = current();
      for (const char* field : {"dtype", "shape", "data_offsets"}) {
        if (seen_fields_.count(field) == 0) {
          return fail("tensor " + backticked(entry.name) + " has no `" + field + "`");
        }
      }
    }
    state_ = (state_ == State::kRoot) ? State::kDone : State::kRoot;
    return true;
  }

  bool start_array(std::size_t /*elements*/) override {
    if (skipping_container()) return true;
    if (state_ == State::kTensorValue && pending_key_ == "shape") {
      current().shape.emplace();
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kTensorValue && pending_key_ == "data_offsets") {
      current().offsets.emplace();
      state_ = State::kOffsets;
      return true;
    }
    return unexpected("an array");
  }

  bool end_array() override {
    if (skip_depth_ > 0) {
      if (--skip_depth_ == 0) state_ = State::kTensor;
      return true;
    }
    if (state_ == State::kOffsets && current().offsets->size() != 2) {
      return fail("tensor " + backticked(current().name) + " has " +
                  std::to_string(current().offsets->size()) + " data_offsets, expected 2");
    }
    state_ = State::kTensor;
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    if (error.empty()) error = "header is not valid JSON: " + printable(ex.what());
    return false;
  }

 private:
  enum class State {
    kStart,          // before the root object
    kRoot,           // in the root object, expecting a key
    kRootValue,      // after a root key: a tensor object or the metadata
    kMetadata,       // in "__metadata__", expecting a key
    kMetadataValue,  // expecting a metadata string
    kTensor,         // in a tensor object, expecting a key
    kTensorValue,    // expecting a tensor field's value
    kShape,          // in "shape"
    kOffsets,        // in "data_offsets"
    kDone,
  };

  TensorEntry& current() { return tensors.back(); }

  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  // Starts or continues skipping an ignored field's value when it is an object or array.
  bool skipping_container() {
    if (skip_depth_ > 0) {
      ++skip_depth_;
      return true;
    }
    if (skip_next_) {
      skip_next_ = false;
      skip_depth_ = 1;
      return true;
    }
    return false;
  }

  // A scalar value: fine inside a skipped field or as a metadata null; wrong anywhere else.
  bool scalar(const std::string& what) {
    if (skip_depth_ > 0) return true;
    if (skip_next_) {
      skip_next_ = false;
      state_ = State::kTensor;
      return true;
    }
    if (state_ == State::kRootValue && pending_key_ == "__metadata__" && what == "null") {
      has_metadata = true;
      state_ = State::kRoot;
      return true;
    }
    return unexpected(what);
  }

  bool unexpected(const std::string& what) {
    switch (state_) {
      case State::kStart:
        return fail("header is " + what + ", not a JSON object");
      case State::kRootValue:
        if (pending_key_ == "__metadata__") {
          return fail("`__metadata__` is " + what + ", not an object of strings");
        }
        return fail("tensor " + backticked(pending_key_) + " is " + what + ", not an object");
      case State::kMetadataValue:
        return fail("metadata value of " + backticked(pending_key_) + " is " + what +
                    ", not a string");
      case State::kTensorValue:
        return fail("tensor " + backticked(current().name) + " has " + what + " as its `" +
                    pending_key_ + "`");
      case State::kShape:
        return fail("tensor " + backticked(current().name) + " has " + what +
                    " in its shape, not a non-negative integer");
      case State::kOffsets:
        return fail("tensor " + backticked(current().name) + " has " + what +
                    " in its data_offsets, not a non-negative integer");
      default:
        return fail("unexpected " + what + " in the header");
    }
  }

  State state_ = State::kStart;
  std::size_t skip_depth_ = 0;  // > 0 while inside an ignored field's object or array
  bool skip_next_ = false;      // the next value belongs to an ignored field
  std::string pending_key_;
  std::set<std::string> seen_names_;
  std::set<std::string> seen_fields_;
};

Error format_error(const std::string& name, const std::string& message) {
  return Error(ErrorKind::kFormat, name + ": " + message);
}

// a * b, or nothing on overflow.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace

std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::int64_t TensorView::num_elements() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;  // checked at parse time: fits
  return n;
}

namespace {

// The header size field of a file whose first bytes are `head` (at least 8).
std::uint64_t header_size_field(std::span<const std::uint8_t> head) {
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | head[static_cast<std::size_t>(i)];
  return header_size;
}

// Parses a file of `file_size` bytes whose data starts at `base`, reading the size field and the
// header from `head` instead: the file's first bytes, at least 8 when the file has them and the
// whole header when it fits the file and the limit. Nothing at `base` is read; only views point
// there.
Result<SafetensorsLayout> parse_layout(std::span<const std::uint8_t> head, std::uint64_t file_size,
                                       const std::uint8_t* base, const std::string& name) {
  if (file_size < 8) {
    return format_error(name, "file is " + std::to_string(file_size) +
                                  " bytes, shorter than the 8-byte header size");
  }
  const std::uint64_t header_size = header_size_field(head);
  if (header_size > kSafetensorsMaxHeaderSize) {
    return format_error(name, "header size " + std::to_string(header_size) +
                                  " exceeds the limit of " +
                                  std::to_string(kSafetensorsMaxHeaderSize) + " bytes");
  }
  const std::uint64_t available = file_size - 8;
  if (header_size > available) {
    return format_error(name, "header size " + std::to_string(header_size) +
                                  " runs past the end of the file (" + std::to_string(available) +
                                  " bytes after the size field)");
  }

  const auto* header_begin = reinterpret_cast<const char*>(head.data() + 8);
  // JSON never contains a raw NUL (not even inside strings), but nlohmann's lexer reads one as the
  // end of the input, which would accept "{}\0garbage": refuse it here.
  if (const void* nul = std::memchr(header_begin, 0, header_size)) {
    return format_error(name, "header is not valid JSON: a NUL byte at offset " +
                                  std::to_string(static_cast<const char*>(nul) - header_begin));
  }
  // The SAX parser keeps a stack per level: depth is bounded before it runs.
  if (!json_depth_within(std::string_view(header_begin, header_size))) {
    return format_error(name, "header " + json_too_deep_text());
  }
  HeaderHandler handler;
  const bool parsed = json::sax_parse(header_begin, header_begin + header_size, &handler,
                                      nlohmann::detail::input_format_t::json, /*strict=*/true);
  if (!parsed || !handler.error.empty()) {
    return format_error(name, handler.error.empty() ? "header is not valid JSON" : handler.error);
  }

  const std::uint64_t buffer_size = available - header_size;
  // No base: a header parsed alone (parse_safetensors_header), its views without data.
  const std::uint8_t* buffer = base != nullptr ? base + 8 + header_size : nullptr;

  struct Placed {
    TensorEntry* entry;
    std::uint64_t begin;
    std::uint64_t end;
    std::uint64_t nbytes;
  };
  std::vector<Placed> placed;
  placed.reserve(handler.tensors.size());
  for (auto& entry : handler.tensors) {
    // Element count and byte count, refusing any overflow on the way.
    std::optional<std::uint64_t> elements = 1;
    for (const auto d : *entry.shape) {
      if (elements) elements = checked_mul(*elements, static_cast<std::uint64_t>(d));
    }
    const unsigned bits = dtype_bits(*entry.dtype);
    const auto total_bits = elements ? checked_mul(*elements, bits) : std::nullopt;
    if (!total_bits) {
      return format_error(name, "tensor " + backticked(entry.name) + ": shape " +
                                    shape_to_string(*entry.shape) + " of " +
                                    std::string(dtype_name(*entry.dtype)) +
                                    " overflows a 64-bit byte count");
    }
    if (*total_bits % 8 != 0) {
      return format_error(name, "tensor " + backticked(entry.name) + ": shape " +
                                    shape_to_string(*entry.shape) + " of " +
                                    std::string(dtype_name(*entry.dtype)) + " is " +
                                    std::to_string(*total_bits) + " bits, not whole bytes");
    }
    placed.push_back(Placed{&entry, (*entry.offsets)[0], (*entry.offsets)[1], *total_bits / 8});
  }
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });

  SafetensorsLayout layout;
  layout.header_size = header_size;
  layout.metadata = std::move(handler.metadata);
  layout.has_metadata = handler.has_metadata;
  layout.tensors.reserve(placed.size());
  std::uint64_t expected_begin = 0;
  for (const auto& p : placed) {
    const std::string& tname = p.entry->name;
    const std::string offsets =
        "data_offsets [" + std::to_string(p.begin) + ", " + std::to_string(p.end) + "]";
    if (p.end < p.begin) {
      return format_error(
          name, "tensor " + backticked(tname) + " has " + offsets + " that end before they begin");
    }
    if (p.begin != expected_begin) {
      return format_error(name, "tensor " + backticked(tname) + " has " + offsets +
                                    " but the previous tensor ends at " +
                                    std::to_string(expected_begin) +
                                    (p.begin > expected_begin ? " (a gap)" : " (an overlap)"));
    }
    if (p.end - p.begin != p.nbytes) {
      return format_error(name, "tensor " + backticked(tname) + ": shape " +
                                    shape_to_string(*p.entry->shape) + " of " +
                                    std::string(dtype_name(*p.entry->dtype)) + " needs " +
                                    std::to_string(p.nbytes) + " bytes but " + offsets + " hold " +
                                    std::to_string(p.end - p.begin));
    }
    if (p.end > buffer_size) {
      return format_error(name, "truncated: tensor " + backticked(tname) + " ends at byte " +
                                    std::to_string(p.end) + " of the data buffer, which has " +
                                    std::to_string(buffer_size) + " bytes");
    }
    expected_begin = p.end;
    TensorView view;
    view.name = std::move(p.entry->name);
    view.dtype = *p.entry->dtype;
    view.shape = std::move(*p.entry->shape);
    view.data = buffer != nullptr ? buffer + p.begin : nullptr;
    view.nbytes = static_cast<std::size_t>(p.nbytes);
    view.file_offset = static_cast<std::size_t>(8 + header_size + p.begin);
    layout.tensors.push_back(std::move(view));
  }
  if (expected_begin != buffer_size) {
    return format_error(name, "the data buffer has " + std::to_string(buffer_size) +
                                  " bytes but the tensors cover " + std::to_string(expected_begin) +
                                  " (" + std::to_string(buffer_size - expected_begin) +
                                  " trailing bytes)");
  }
  return layout;
}

}  // namespace

Result<SafetensorsLayout> parse_safetensors(std::span<const std::uint8_t> bytes,
                                            const std::string& name) {
  return parse_layout(bytes, bytes.size(), bytes.data(), name);
}

Result<SafetensorsLayout> parse_safetensors_header(std::span<const std::uint8_t> head,
                                                   std::uint64_t file_size,
                                                   const std::string& name) {
  if (head.size() < 8) {
    return format_error(name, "the header is " + std::to_string(head.size()) +
                                  " bytes, shorter than the 8-byte header size");
  }
  const std::uint64_t header_size = header_size_field(head);
  if (header_size != head.size() - 8) {
    return format_error(name, "the header size field says " + std::to_string(header_size) +
                                  " bytes, the header has " + std::to_string(head.size() - 8));
  }
  return parse_layout(head, file_size, nullptr, name);
}

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::open(const std::string& path,
                                                                     MapOptions options) {
  auto mapping = MappedFile::open(path, options);
  if (!mapping.ok()) return mapping.error();
  return from_mapping(std::move(mapping).value());
}

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::from_mapping(
    std::shared_ptr<const MappedFile> mapping) {
  // The header is copied out of the mapping under a fault guard and parsed from the copy: the
  // file may shrink under the mapping at any time (another process truncating it), and the parser
  // (allocating as it goes) must never be interrupted by a SIGBUS.
  const std::uint8_t* base = mapping->data();
  const std::uint64_t file_size = mapping->size();
  std::vector<std::uint8_t> head(static_cast<std::size_t>(std::min<std::uint64_t>(file_size, 8)));
  bool readable = guarded_copy(head.data(), base, head.size());
  if (readable && head.size() == 8) {
    const std::uint64_t header_size = header_size_field(head);
    if (header_size <= kSafetensorsMaxHeaderSize && header_size <= file_size - 8) {
      head.resize(static_cast<std::size_t>(8 + header_size));
      readable = guarded_copy(head.data() + 8, base + 8, static_cast<std::size_t>(header_size));
    }
  }
  if (!readable) {
    return Error(ErrorKind::kIo, mapping->path() +
                                     ": the file shrank while its header was read (truncated "
                                     "by another process: SIGBUS on the mapping)");
  }
  auto layout = parse_layout(head, file_size, base, mapping->path());
  if (!layout.ok()) return layout.error();
  SafetensorsLayout checked = std::move(layout).value();
  for (auto& view : checked.tensors) view.mapping = mapping;
  return std::shared_ptr<const SafetensorsFile>(
      new SafetensorsFile(std::move(mapping), std::move(checked)));
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  for (const auto& view : layout_.tensors) {
    if (view.name == name) return &view;
  }
  return nullptr;
}

}  // namespace draftfeed
