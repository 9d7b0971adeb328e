// Reading safetensors files: memory-mapped, zero-copy tensor views, every layout rule checked.
//
// Layout (docs/formats.md): a little-endian u64 header size N, N bytes of JSON, then the data
// buffer. The JSON object maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the buffer) plus an optional "__metadata__" string-to-string map. Rules
// enforced, each with its own message naming the file and the numbers involved:
//   * the file holds the 8-byte size field; N <= 100,000,000; the header lies inside the file;
//   * the header is one JSON object (surrounding whitespace allowed; nesting capped at 64);
//   * every tensor has a known dtype, a shape of non-negative integers and exactly two offsets;
//     unknown extra fields are ignored, as the safetensors package does;
//   * no duplicate key anywhere (tensor names, fields, metadata keys). Stricter than the package,
//     which keeps the last of two equal tensor names: a duplicate is a writer bug worth refusing;
//   * shape x element bits is a whole number of bytes equal to end - begin (overflow-checked);
//   * sorted by (begin, end) the tensors tile the buffer: the first begins at 0, each begins where
//     the previous ended, the last ends at the end of the file (no gap, overlap or trailing byte).
// No alignment is required: views may start at any byte, so readers must use unaligned loads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/common/mapped_file.h"

namespace draftfeed {

// The largest header the safetensors package accepts.
inline constexpr std::uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

// One tensor inside a file: its bytes are not copied.
struct TensorView {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;
  const std::uint8_t* data = nullptr;  // first byte; any alignment
  std::size_t nbytes = 0;
  std::size_t file_offset = 0;  // of `data` from the start of the file
  // Keeps `data` valid; null when the view was parsed from a caller's span.
  std::shared_ptr<const MappedFile> mapping;

  std::int64_t num_elements() const;
  std::span<const std::uint8_t> bytes() const { return {data, nbytes}; }
};

// What a header says, with views into the bytes it was parsed from.
struct SafetensorsLayout {
  std::vector<TensorView> tensors;  // sorted by data offset (file order)
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;      // a "__metadata__" key was present (possibly null)
  std::uint64_t header_size = 0;  // N
};

// Parses and checks a whole safetensors file held in `bytes`; `name` (a path) starts every error
// message. Errors are kFormat. The views point into `bytes` and have no `mapping`.
// Safe on any input: this is the fuzz target's entry point.
Result<SafetensorsLayout> parse_safetensors(std::span<const std::uint8_t> bytes,
                                            const std::string& name);

// Parses and checks the header of a safetensors file of `file_size` bytes from `head`, its size
// field and JSON header exactly (nothing after): every rule of parse_safetensors, the tiling of a
// buffer that ends at `file_size` included. The views have no data (`data` null): the buffer is
// not there. Errors are kFormat.
Result<SafetensorsLayout> parse_safetensors_header(std::span<const std::uint8_t> head,
                                                   std::uint64_t file_size,
                                                   const std::string& name);

// A checked, mapped safetensors file. Immutable; any number of threads may read it.
class SafetensorsFile {
 public:
  // Maps and checks `path`. A missing file is kNotFound, an unreadable one kIo, a bad one kFormat.
  // `options` as MappedFile::open's (keep_descriptor: its tensors can be read with read_at).
  static Result<std::shared_ptr<const SafetensorsFile>> open(const std::string& path,
                                                             MapOptions options = {});
  // Checks an existing mapping (the views keep it alive).
  static Result<std::shared_ptr<const SafetensorsFile>> from_mapping(
      std::shared_ptr<const MappedFile> mapping);

  const std::string& path() const { return mapping_->path(); }
  const std::shared_ptr<const MappedFile>& mapping() const { return mapping_; }
  std::size_t file_size() const { return mapping_->size(); }
  std::uint64_t header_size() const { return layout_.header_size; }

  const std::vector<TensorView>& tensors() const { return layout_.tensors; }
  // The tensor called `name`, or null.
  const TensorView* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return layout_.metadata; }
  bool has_metadata() const { return layout_.has_metadata; }

 private:
  SafetensorsFile(std::shared_ptr<const MappedFile> mapping, SafetensorsLayout layout)
      : mapping_(std::move(mapping)), layout_(std::move(layout)) {}
  std::shared_ptr<const MappedFile> mapping_;
  SafetensorsLayout layout_;
};

// "[2, 3, 4]": shapes in messages.
std::string shape_to_string(std::span<const std::int64_t> shape);

}  // namespace draftfeed
