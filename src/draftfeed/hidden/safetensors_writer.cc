#include "draftfeed/hidden/safetensors_writer.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <set>

#include "draftfeed/common/error.h"
#include "draftfeed/common/json_escape.h"
#include "draftfeed/hidden/safetensors.h"

namespace draftfeed {

namespace {

Error invalid(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

bool valid_utf8(const std::string& text) {
  std::size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  while (i < text.size()) {
    const unsigned char c = s[i];
    std::size_t extra;
    std::uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code = c & 0x07u;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      code = (code << 6) | (s[i + k] & 0x3Fu);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    const std::uint32_t min_code = extra == 1 ? 0x80 : extra == 2 ? 0x800 : 0x10000;
    if (code < min_code || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

// A JSON string literal escaped the way serde_json does it.
void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (const char ch : text) append_json_escaped(out, static_cast<unsigned char>(ch));
  out += '"';
}

// The tensors in the package's file order: dtype descending, then name.
std::vector<const TensorToWrite*> file_order(std::span<const TensorToWrite> tensors) {
  std::vector<const TensorToWrite*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    if (a->dtype != b->dtype) return a->dtype > b->dtype;
    return a->name < b->name;
  });
  return order;
}

void check_tensor(const TensorToWrite& t) {
  if (!valid_utf8(t.name)) throw invalid("tensor name is not valid UTF-8");
  if (t.name == "__metadata__") throw invalid("a tensor cannot be called `__metadata__`");
  std::uint64_t bits = dtype_bits(t.dtype);
  for (const auto d : t.shape) {
    if (d < 0)
      throw invalid("tensor `" + t.name + "` has a negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(bits, static_cast<std::uint64_t>(d), &bits)) {
      throw invalid("tensor `" + t.name + "`: shape " + shape_to_string(t.shape) + " overflows");
    }
  }
  if (bits % 8 != 0 || bits / 8 != t.bytes.size()) {
    throw invalid("tensor `" + t.name + "`: shape " + shape_to_string(t.shape) + " of " +
                  std::string(dtype_name(t.dtype)) + " needs " + std::to_string(bits) +
                  " bits but " + std::to_string(t.bytes.size()) + " bytes were given");
  }
}

Error os_error(const std::string& what, const std::string& path, int err) {
  return Error(ErrorKind::kIo, path + ": " + what + ": " + os_error_text(err));
}

// Writes every iovec fully, retrying partial writes and EINTR.
void write_all(int fd, std::vector<iovec> parts, const std::string& path) {
  std::size_t first = 0;
  while (first < parts.size()) {
    const int count = static_cast<int>(std::min<std::size_t>(parts.size() - first, IOV_MAX));
    const ssize_t written = ::writev(fd, parts.data() + first, count);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw os_error("cannot write", path, errno);
    }
    auto left = static_cast<std::size_t>(written);
    while (first < parts.size() && left >= parts[first].iov_len) {
      left -= parts[first].iov_len;
      ++first;
    }
    if (first < parts.size()) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + left;
      parts[first].iov_len -= left;
    }
  }
}

std::atomic<std::uint64_t> temp_counter{0};

}  // namespace

std::string safetensors_header(std::span<const TensorToWrite> tensors,
                               const std::map<std::string, std::string>* metadata) {
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    check_tensor(t);
    if (!names.insert(t.name).second) throw invalid("the tensor name `" + t.name + "` repeats");
  }
  std::string out = "{";
  if (metadata != nullptr) {
    out += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : *metadata) {
      if (!valid_utf8(key) || !valid_utf8(value)) {
        throw invalid("metadata entry `" + key + "` is not valid UTF-8");
      }
      if (!first) out += ',';
      first = false;
      append_json_string(out, key);
      out += ':';
      append_json_string(out, value);
    }
    out += "}";
  }
  std::uint64_t offset = 0;
  for (const TensorToWrite* t : file_order(tensors)) {
    if (out.size() > 1) out += ',';
    append_json_string(out, t->name);
    out += ":{\"dtype\":\"";
    out += dtype_name(t->dtype);
    out += "\",\"shape\":[";
    for (std::size_t i = 0; i < t->shape.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(t->shape[i]);
    }
    out += "],\"data_offsets\":[" + std::to_string(offset) + ",";
    offset += t->bytes.size();
    out += std::to_string(offset) + "]}";
  }
  out += '}';
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

std::vector<std::uint8_t> serialize_safetensors(
    std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>* metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  std::size_t total = 8 + header.size();
  for (const auto& t : tensors) total += t.bytes.size();
  std::vector<std::uint8_t> out;
  out.reserve(total);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (const TensorToWrite* t : file_order(tensors)) {
    out.insert(out.end(), t->bytes.begin(), t->bytes.end());
  }
  return out;
}

void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>* metadata,
                       const SafetensorsWriteOptions& options) {
  const std::string header = safetensors_header(tensors, metadata);
  std::uint8_t size_field[8];
  for (int i = 0; i < 8; ++i) size_field[i] = static_cast<std::uint8_t>(header.size() >> (8 * i));
  std::vector<iovec> parts;
  parts.push_back({size_field, 8});
  parts.push_back({const_cast<char*>(header.data()), header.size()});
  for (const TensorToWrite* t : file_order(tensors)) {
    if (!t->bytes.empty()) {
      parts.push_back({const_cast<std::uint8_t*>(t->bytes.data()), t->bytes.size()});
    }
  }

  const std::filesystem::path target(path);
  // Built step by step: GCC 12 reports a bogus -Wrestrict for `"." + std::string&&` at -O3.
  std::string temp_name = ".";
  temp_name += target.filename().string();
  temp_name +=
      ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(temp_counter.fetch_add(1));
  const std::string write_path =
      options.atomic ? (target.parent_path() / temp_name).string() : path;
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.atomic ? O_EXCL : O_TRUNC);
  const int fd = ::open(write_path.c_str(), flags, 0644);
  if (fd < 0) throw os_error("cannot create", write_path, errno);
  try {
    write_all(fd, std::move(parts), write_path);
    if (options.fsync && ::fsync(fd) != 0) throw os_error("cannot fsync", write_path, errno);
  } catch (...) {
    ::close(fd);
    if (options.atomic) ::unlink(write_path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    if (options.atomic) ::unlink(write_path.c_str());
    throw os_error("cannot close", write_path, err);
  }
  if (!options.atomic) return;
  if (::rename(write_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(write_path.c_str());
    throw os_error("cannot rename " + write_path + " to", path, err);
  }
  if (options.fsync) {
    const std::string folder =
        target.parent_path().empty() ? std::string(".") : target.parent_path().string();
    const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }
}

}  // namespace draftfeed
