#include "draftfeed/batch/pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

bool supported(DType dtype) {
  return dtype == DType::kBool || dtype_is_integer(dtype) || dtype == DType::kF16 ||
         dtype == DType::kBF16 || dtype == DType::kF32 || dtype == DType::kF64;
}

template <typename T>
T load_as(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

template <typename T>
void store_as(std::uint8_t* p, T value) {
  std::memcpy(p, &value, sizeof value);
}

// One element, read exactly: integers (and bool) as int64 (uint64 above 2^63 wraps, as torch's
// casts do), floats as double (every f16/bf16/f32 value is exact in double).
struct Element {
  bool floating = false;
  std::int64_t integer = 0;
  double real = 0;
};

Element load(const std::uint8_t* p, DType dtype) {
  Element e;
  switch (dtype) {
    case DType::kBool:
      e.integer = *p != 0 ? 1 : 0;
      break;
    case DType::kU8:
      e.integer = *p;
      break;
    case DType::kI8: {
      const std::int8_t value = load_as<std::int8_t>(p);  // named: an int8 is a number
      e.integer = value;
      break;
    }
    case DType::kI16:
      e.integer = load_as<std::int16_t>(p);
      break;
    case DType::kU16:
      e.integer = load_as<std::uint16_t>(p);
      break;
    case DType::kI32:
      e.integer = load_as<std::int32_t>(p);
      break;
    case DType::kU32:
      e.integer = load_as<std::uint32_t>(p);
      break;
    case DType::kI64:
      e.integer = load_as<std::int64_t>(p);
      break;
    case DType::kU64:
      e.integer = static_cast<std::int64_t>(load_as<std::uint64_t>(p));
      break;
    case DType::kF16:
      e.floating = true;
      e.real = f16_to_float(load_as<std::uint16_t>(p));
      break;
    case DType::kBF16:
      e.floating = true;
      e.real = bf16_to_float(load_as<std::uint16_t>(p));
      break;
    case DType::kF32:
      e.floating = true;
      e.real = load_as<float>(p);
      break;
    case DType::kF64:
      e.floating = true;
      e.real = load_as<double>(p);
      break;
    default:
      break;
  }
  return e;
}

// The value as float32, as torch converts it on the way to a narrower float: doubles round once
// to float, integers convert directly (no double rounding through a wider type).
float as_float(const Element& e) {
  return e.floating ? static_cast<float>(e.real) : static_cast<float>(e.integer);
}

// Floats to integers truncate toward zero; NaN and values out of int64's range become 0 (torch
// leaves them undefined).
std::int64_t as_integer(const Element& e) {
  if (!e.floating) return e.integer;
  if (!(std::fabs(e.real) < 9.2e18)) return 0;
  return static_cast<std::int64_t>(e.real);
}

void store(std::uint8_t* p, DType dtype, const Element& e) {
  switch (dtype) {
    case DType::kBool:
      *p = (e.floating ? e.real != 0.0 : e.integer != 0) ? 1 : 0;
      break;
    case DType::kU8:
      *p = static_cast<std::uint8_t>(as_integer(e));
      break;
    case DType::kI8:
      store_as(p, static_cast<std::int8_t>(as_integer(e)));
      break;
    case DType::kI16:
      store_as(p, static_cast<std::int16_t>(as_integer(e)));
      break;
    case DType::kU16:
      store_as(p, static_cast<std::uint16_t>(as_integer(e)));
      break;
    case DType::kI32:
      store_as(p, static_cast<std::int32_t>(as_integer(e)));
      break;
    case DType::kU32:
      store_as(p, static_cast<std::uint32_t>(as_integer(e)));
      break;
    case DType::kI64:
      store_as(p, as_integer(e));
      break;
    case DType::kU64:
      store_as(p, static_cast<std::uint64_t>(as_integer(e)));
      break;
    case DType::kF16:
      store_as(p, float_to_f16(as_float(e)));
      break;
    case DType::kBF16:
      store_as(p, float_to_bf16(as_float(e)));
      break;
    case DType::kF32:
      store_as(p, as_float(e));
      break;
    case DType::kF64:
      store_as(p, e.floating ? e.real : static_cast<double>(e.integer));
      break;
    default:
      break;
  }
}

// `count` elements from `src` (dtype `from`) to `dst` (dtype `to`).
void convert(const std::uint8_t* src, DType from, std::uint8_t* dst, DType to, std::int64_t count) {
  const std::size_t in = dtype_size(from);
  const std::size_t out = dtype_size(to);
  if (from == to) {
    std::memcpy(dst, src, static_cast<std::size_t>(count) * in);
    return;
  }
  // The hidden-state casts, on their own loops (the common ones by far).
  if (from == DType::kF32 && to == DType::kBF16) {
    for (std::int64_t i = 0; i < count; ++i) {
      store_as(dst + 2 * i, float_to_bf16(load_as<float>(src + 4 * i)));
    }
    return;
  }
  if (from == DType::kBF16 && to == DType::kF32) {
    for (std::int64_t i = 0; i < count; ++i) {
      store_as(dst + 4 * i, bf16_to_float(load_as<std::uint16_t>(src + 2 * i)));
    }
    return;
  }
  for (std::int64_t i = 0; i < count; ++i) {
    store(dst + static_cast<std::size_t>(i) * out, to,
          load(src + static_cast<std::size_t>(i) * in, from));
  }
}

std::int64_t row_elements(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(shape[d]);
  }
  return text + "]";
}

// The reference's lengths loop: each sample's `lengths` values in turn; the one reaching max_len
// is cut there and ends the list.
std::vector<std::int64_t> document_lengths(const std::vector<SampleArg>& samples,
                                           std::int64_t max_len) {
  std::vector<std::int64_t> documents;
  std::int64_t used = 0;
  for (const SampleArg& sample : samples) {
    const TensorArg& lengths = *sample.find("lengths");
    for (std::int64_t k = 0; k < lengths.shape[0]; ++k) {
      const std::int64_t length = as_integer(load(
          lengths.data + static_cast<std::size_t>(k * lengths.row_stride_bytes), lengths.dtype));
      require(length >= 0, ErrorKind::kInvalidArgument,
              "preprocess returned a negative length " + std::to_string(length));
      if (length + used >= max_len) {
        documents.push_back(max_len - used);
        return documents;
      }
      documents.push_back(length);
      used += length;
    }
  }
  return documents;
}

}  // namespace

const TensorArg* SampleArg::find(const std::string& key) const {
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == key) return &tensors[k];
  }
  return nullptr;
}

PackedLayout layout_packed(const std::vector<SampleArg>& samples, std::int64_t max_len,
                           DType hidden_dtype) {
  require(!samples.empty(), ErrorKind::kInvalidArgument, "pack: no samples");
  require(max_len > 0, ErrorKind::kInvalidArgument,
          "pack: max_len must be positive, got " + std::to_string(max_len));
  require(hidden_dtype == DType::kBF16 || hidden_dtype == DType::kF32, ErrorKind::kInvalidArgument,
          "pack: the batch dtype must be bfloat16 or float32");
  const SampleArg& first = samples.front();
  for (std::size_t s = 0; s < samples.size(); ++s) {
    const SampleArg& sample = samples[s];
    // Messages are built only when thrown: this runs for every tensor of every sample.
    auto refuse = [s](const std::string& what) {
      return Error(ErrorKind::kInvalidArgument,
                   "preprocess returned sample " + std::to_string(s) + what);
    };
    if (sample.find("lengths") == nullptr) throw refuse(" without 'lengths'");
    for (std::size_t k = 0; k < sample.keys.size(); ++k) {
      const TensorArg& t = sample.tensors[k];
      if (t.shape.empty()) {
        throw refuse(": '" + sample.keys[k] + "' is a 0-d tensor; the collate needs rows");
      }
      if (!supported(t.dtype)) {
        throw refuse(": '" + sample.keys[k] + "' has an unsupported dtype " +
                     std::string(dtype_name(t.dtype)));
      }
    }
    for (const std::string& key : first.keys) {
      if (key == "lengths") continue;
      const TensorArg* t = sample.find(key);
      if (t == nullptr) throw refuse(" has no '" + key + "' (the first sample has it)");
      const TensorArg& f = *first.find(key);
      if (!std::equal(t->shape.begin() + 1, t->shape.end(), f.shape.begin() + 1, f.shape.end())) {
        throw refuse(": '" + key + "' has shape " + shape_text(t->shape) +
                     ", whose trailing dimensions differ from the first sample's " +
                     shape_text(f.shape));
      }
    }
  }
  PackedLayout layout;
  auto add = [&](const std::string& name, DType dtype, std::vector<std::int64_t> shape) {
    PackedTensor t{name, dtype, std::move(shape), 0, 0};
    std::size_t elements = 1;
    for (const auto dim : t.shape) elements *= static_cast<std::size_t>(dim);
    t.offset = layout.total_bytes;
    t.nbytes = elements * dtype_size(dtype);
    layout.total_bytes = (t.offset + t.nbytes + 63) / 64 * 64;
    layout.tensors.push_back(std::move(t));
  };
  for (std::size_t k = 0; k < first.keys.size(); ++k) {
    const std::string& key = first.keys[k];
    if (key == "lengths") continue;
    const TensorArg& t = first.tensors[k];
    std::vector<std::int64_t> shape{1, max_len};
    shape.insert(shape.end(), t.shape.begin() + 1, t.shape.end());
    const bool hidden = key.find("hidden_states") != std::string::npos;
    add(key, hidden ? hidden_dtype : t.dtype, std::move(shape));
  }
  add("document_ids", DType::kI64, {1, max_len});
  return layout;
}

void pack_samples(const std::vector<SampleArg>& samples, std::int64_t max_len,
                  const PackedLayout& layout, std::uint8_t* out) {
  // Lengths first: a bad one fails the call before anything is written.
  const std::vector<std::int64_t> lengths = document_lengths(samples, max_len);
  std::memset(out, 0, layout.total_bytes);
  for (const PackedTensor& packed : layout.tensors) {
    if (packed.name == "document_ids") continue;
    const std::int64_t width = row_elements(packed.shape) / max_len;  // elements per row
    const std::size_t out_row = static_cast<std::size_t>(width) * dtype_size(packed.dtype);
    std::int64_t offset = 0;
    for (const SampleArg& sample : samples) {
      const TensorArg& t = *sample.find(packed.name);
      const std::int64_t rows = std::min(t.shape[0], max_len - offset);
      for (std::int64_t r = 0; r < rows; ++r) {
        convert(t.data + static_cast<std::size_t>(r) * static_cast<std::size_t>(t.row_stride_bytes),
                t.dtype, out + packed.offset + static_cast<std::size_t>(offset + r) * out_row,
                packed.dtype, width);
      }
      offset += rows;
      if (offset == max_len) break;
    }
  }
  const PackedTensor& documents = layout.tensors.back();
  auto* document_ids = reinterpret_cast<std::int64_t*>(out + documents.offset);
  std::int64_t row = 0;
  for (std::size_t doc = 0; doc < lengths.size(); ++doc) {
    std::fill_n(document_ids + row, lengths[doc], static_cast<std::int64_t>(doc));
    row += lengths[doc];
  }
  std::fill(document_ids + row, document_ids + max_len, std::int64_t{-1});
}

}  // namespace draftfeed
