// Writing safetensors files in the canonical layout of the safetensors package, so the package
// loads them and, for the same tensors and at most one metadata key, the bytes are identical:
//   * tensors ordered by dtype, descending in the package's dtype order (8-byte types first), then
//     by name; offsets packed back to back from 0;
//   * header: compact JSON, "__metadata__" first when given, then the tensors in that order;
//   strings
//     escaped as serde_json does; padded with spaces so the data starts at a multiple of 8.
// Metadata keys are written in sorted order (the package's order is a hash map's, i.e. arbitrary).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;
  std::span<const std::uint8_t> bytes;  // exactly shape x element size
};

struct SafetensorsWriteOptions {
  // Write `<dir>/.<name>.tmp-<pid>-<n>` then rename it over the target, so no reader ever sees a
  // partial file. Off: write the target in place.
  bool atomic = true;
  // fsync the file before the rename (and the folder after it).
  bool fsync = false;
};

// The header bytes (size field excluded): JSON plus padding. Throws Error(kInvalidArgument) when a
// tensor's byte count disagrees with its shape, a name repeats or is "__metadata__", or a string
// is not valid UTF-8. `metadata` null writes no "__metadata__" key.
std::string safetensors_header(std::span<const TensorToWrite> tensors,
                               const std::map<std::string, std::string>* metadata);

// The whole file in memory.
std::vector<std::uint8_t> serialize_safetensors(std::span<const TensorToWrite> tensors,
                                                const std::map<std::string, std::string>* metadata);

// Writes the file at `path`. Throws Error(kIo) naming the path when the OS refuses.
void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>* metadata = nullptr,
                       const SafetensorsWriteOptions& options = {});

}  // namespace draftfeed
