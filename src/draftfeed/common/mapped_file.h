// A read-only memory mapping of a whole file, shared by every view into it.
//
// Views (Arrow columns, safetensors tensors) hold a `std::shared_ptr<const MappedFile>` so the
// mapping outlives every pointer into it, including arrays handed to Python.
// Thread safety: immutable after `open`; any number of threads may read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

class MappedFile {
 public:
  // Maps `path` read-only. A missing file is ErrorKind::kNotFound; a folder or a file the OS will
  // not map is ErrorKind::kIo. An empty file maps to an empty span (no mmap call).
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);

  // Same, but throws the Error.
  static std::shared_ptr<const MappedFile> open_or_throw(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Asks the kernel to read ahead the given range (MADV_WILLNEED); a hint, never an error.
  void prefetch(std::size_t offset, std::size_t length) const;

 private:
  MappedFile(std::string path, const std::uint8_t* data, std::size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const std::uint8_t* data_;
  std::size_t size_;
};

}  // namespace draftfeed
