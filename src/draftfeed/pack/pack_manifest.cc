#include "draftfeed/pack/pack_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "draftfeed/common/json_depth.h"
#include "draftfeed/common/xxh64.h"
#include "draftfeed/pack/durable_file.h"
#include "draftfeed/pack/plane_codec.h"

namespace draftfeed {

namespace {

using json = nlohmann::json;

constexpr std::int64_t kMaxRow = std::int64_t{1} << 53;
constexpr std::uint64_t kMaxShardBytes = std::uint64_t{1} << 50;
constexpr const char* kSampleFields[] = {"row",      "shard",      "offset", "length",
                                         "checksum", "file_bytes", "layout"};
constexpr std::size_t kSampleFieldCount = 7;

Error bad(const std::string& name, const std::string& what) {
  return Error(ErrorKind::kFormat, name + ": " + what);
}

bool is_hex64(const std::string& text) {
  return text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// An unsigned JSON integer within [0, max], else nothing.
std::optional<std::uint64_t> unsigned_field(const json& value, std::uint64_t max) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v <= max) return v;
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v >= 0 && static_cast<std::uint64_t>(v) <= max) return static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

}  // namespace

std::string pack_shard_name(std::uint32_t index) {
  std::string digits = std::to_string(index);
  if (digits.size() < 6) digits.insert(0, 6 - digits.size(), '0');
  return "shard-" + digits + ".safetensors";
}

bool is_pack_shard_name(const std::string& name) {
  constexpr std::string_view kPrefix = "shard-";
  constexpr std::string_view kSuffix = ".safetensors";
  if (name.size() < kPrefix.size() + 6 + kSuffix.size() || name.size() > 64) return false;
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  if (name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return false;
  const std::string digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const std::uint64_t index = std::stoull(digits);
  return index <= UINT32_MAX && pack_shard_name(static_cast<std::uint32_t>(index)) == name;
}

std::string pack_manifest_json(const PackManifest& manifest) {
  json j = json::object();
  j["format"] = kPackFormat;
  j["format_version"] = kPackFormatVersion;
  j["codec"] = manifest.codec;
  j["num_samples"] = manifest.samples.size();
  if (manifest.budget_bytes > 0) j["budget_bytes"] = manifest.budget_bytes;
  json shards = json::array();
  for (const PackShard& shard : manifest.shards) {
    shards.push_back({{"file", shard.file}, {"bytes", shard.bytes}});
  }
  j["shards"] = std::move(shards);
  j["sample_fields"] = kSampleFields;
  json samples = json::array();
  for (const PackEntry& e : manifest.samples) {
    samples.push_back(json::array({e.row, e.shard, e.offset, e.length, xxh64_hex(e.checksum),
                                   e.file_bytes, static_cast<int>(e.layout)}));
  }
  j["samples"] = std::move(samples);
  return j.dump() + "\n";
}

Result<PackManifest> parse_pack_manifest(std::span<const std::uint8_t> text,
                                         const std::string& name) {
  if (text.size() > kMaxManifestBytes) {
    return bad(name, std::to_string(text.size()) + " bytes, more than the " +
                         std::to_string(kMaxManifestBytes) + " a manifest may have");
  }
  // The JSON parser recurses per level: depth is bounded before it runs.
  if (!json_depth_within(
          std::string_view(reinterpret_cast<const char*>(text.data()), text.size()))) {
    return bad(name, json_too_deep_text());
  }
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad(name, "not valid JSON");
  if (!j.is_object()) return bad(name, "not a JSON object");
  const auto field = [&](const char* key) -> const json* {
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };
  const json* format = field("format");
  if (format == nullptr || !format->is_string() || format->get<std::string>() != kPackFormat) {
    return bad(name, std::string("\"format\" is not \"") + kPackFormat + "\"");
  }
  const json* version = field("format_version");
  if (version == nullptr || !version->is_number_integer() ||
      version->get<std::int64_t>() != kPackFormatVersion) {
    return bad(name, "\"format_version\" is not " + std::to_string(kPackFormatVersion) +
                         " (a pack written by another draftfeed version: unpack it with that one)");
  }
  PackManifest manifest;
  const json* codec = field("codec");
  if (codec == nullptr || !codec->is_string()) return bad(name, "no \"codec\" string");
  manifest.codec = codec->get<std::string>();
  if (manifest.codec != "none" && manifest.codec != kPlaneCodecName) {
    return bad(name, "unknown codec \"" + manifest.codec.substr(0, 64) + "\" (none, " +
                         kPlaneCodecName + ")");
  }
  if (const json* budget = field("budget_bytes")) {
    const std::optional<std::uint64_t> value = unsigned_field(*budget, kMaxShardBytes);
    if (!value) return bad(name, "\"budget_bytes\" is not a byte count");
    manifest.budget_bytes = *value;
  }
  const json* fields = field("sample_fields");
  if (fields == nullptr || !fields->is_array() || fields->size() != kSampleFieldCount) {
    return bad(name, "\"sample_fields\" is not the 7 names this version writes");
  }
  for (std::size_t i = 0; i < kSampleFieldCount; ++i) {
    if (!(*fields)[i].is_string() || (*fields)[i].get<std::string>() != kSampleFields[i]) {
      return bad(
          name, "\"sample_fields\"[" + std::to_string(i) + "] is not \"" + kSampleFields[i] + "\"");
    }
  }
  const json* shards = field("shards");
  if (shards == nullptr || !shards->is_array()) return bad(name, "no \"shards\" array");
  if (shards->size() > UINT32_MAX) return bad(name, "too many shards");
  std::unordered_set<std::string> shard_names;
  for (std::size_t i = 0; i < shards->size(); ++i) {
    const json& s = (*shards)[i];
    const std::string where = "shards[" + std::to_string(i) + "]";
    if (!s.is_object()) return bad(name, where + " is not an object");
    const auto file = s.find("file");
    const auto bytes = s.find("bytes");
    if (file == s.end() || !file->is_string() || !is_pack_shard_name(file->get<std::string>())) {
      return bad(name, where + ".file is not a shard name (shard-NNNNNN.safetensors)");
    }
    const std::optional<std::uint64_t> size =
        bytes == s.end() ? std::nullopt : unsigned_field(*bytes, kMaxShardBytes);
    if (!size) return bad(name, where + ".bytes is not a byte count");
    if (!shard_names.insert(file->get<std::string>()).second) {
      return bad(name, where + ".file repeats " + file->get<std::string>());
    }
    manifest.shards.push_back(PackShard{file->get<std::string>(), *size});
  }
  const json* samples = field("samples");
  if (samples == nullptr || !samples->is_array()) return bad(name, "no \"samples\" array");
  const json* count = field("num_samples");
  if (count == nullptr || unsigned_field(*count, UINT64_MAX) != samples->size()) {
    return bad(name, "\"num_samples\" is not the number of samples listed (" +
                         std::to_string(samples->size()) + ")");
  }
  manifest.samples.reserve(samples->size());
  std::unordered_set<std::int64_t> rows;
  rows.reserve(samples->size());
  for (std::size_t i = 0; i < samples->size(); ++i) {
    const json& s = (*samples)[i];
    const std::string where = "samples[" + std::to_string(i) + "]";
    if (!s.is_array() || s.size() != kSampleFieldCount) {
      return bad(name, where + " is not an array of " + std::to_string(kSampleFieldCount));
    }
    PackEntry e;
    const auto row = unsigned_field(s[0], kMaxRow);
    const auto shard =
        unsigned_field(s[1], manifest.shards.empty() ? 0 : manifest.shards.size() - 1);
    const auto offset = unsigned_field(s[2], kMaxShardBytes);
    const auto length = unsigned_field(s[3], kMaxShardBytes);
    const auto file_bytes = unsigned_field(s[5], kMaxShardBytes);
    const auto layout = unsigned_field(s[6], kCacheLayoutCount - 1);
    if (!row) return bad(name, where + ": the row is not an integer in [0, 2^53]");
    const std::string where_row = where + " (row " + std::to_string(*row) + ")";
    if (!shard || manifest.shards.empty()) {
      return bad(name, where_row + ": the shard is not an index into \"shards\"");
    }
    if (!offset || !length || *length == 0 || !file_bytes || !layout) {
      return bad(name, where_row + ": offset, length, file_bytes or layout out of range");
    }
    if (!s[4].is_string() || !is_hex64(s[4].get<std::string>())) {
      return bad(name, where_row + ": the checksum is not 16 lowercase hex digits");
    }
    e.row = static_cast<std::int64_t>(*row);
    e.shard = static_cast<std::uint32_t>(*shard);
    e.offset = *offset;
    e.length = *length;
    e.checksum = std::stoull(s[4].get<std::string>(), nullptr, 16);
    e.file_bytes = *file_bytes;
    e.layout = static_cast<CacheLayout>(*layout);
    if (e.offset + e.length > manifest.shards[e.shard].bytes) {
      return bad(name, where_row + ": bytes " + std::to_string(e.offset) + ".." +
                           std::to_string(e.offset + e.length) + " lie past the end of " +
                           manifest.shards[e.shard].file + " (" +
                           std::to_string(manifest.shards[e.shard].bytes) + " bytes)");
    }
    if (!rows.insert(e.row).second) return bad(name, where_row + ": the row is listed twice");
    manifest.samples.push_back(e);
  }
  // No two samples share a byte of a shard.
  std::vector<const PackEntry*> order;
  order.reserve(manifest.samples.size());
  for (const PackEntry& e : manifest.samples) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const PackEntry* a, const PackEntry* b) {
    return a->shard != b->shard ? a->shard < b->shard : a->offset < b->offset;
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const PackEntry& a = *order[i - 1];
    const PackEntry& b = *order[i];
    if (a.shard == b.shard && a.offset + a.length > b.offset) {
      return bad(name, "rows " + std::to_string(a.row) + " and " + std::to_string(b.row) +
                           " overlap in " + manifest.shards[a.shard].file + " at offset " +
                           std::to_string(b.offset));
    }
  }
  return manifest;
}

namespace {

FileStamp stamp_of(const struct stat& st) {
  FileStamp stamp;
  stamp.exists = true;
  stamp.device = static_cast<std::uint64_t>(st.st_dev);
  stamp.inode = static_cast<std::uint64_t>(st.st_ino);
  stamp.size = static_cast<std::uint64_t>(st.st_size);
  stamp.mtime_ns =
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return stamp;
}

}  // namespace

FileStamp pack_manifest_stamp(const std::string& root) {
  const std::string path = root + "/" + kPackManifestName;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return FileStamp{};
  return stamp_of(st);
}

Result<std::optional<PackManifest>> read_pack_manifest(const std::string& root, FileStamp* stamp) {
  const std::string path = root + "/" + kPackManifestName;
  if (stamp != nullptr) *stamp = FileStamp{};
  // Non-blocking: a FIFO by that name must not hang the loader (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) return std::optional<PackManifest>();
    // A folder this process may not search has no pack it can read: its rows' files are not
    // readable either, and each says so where it is looked up (as without a pack).
    if (error == EACCES && ::access(root.c_str(), X_OK) != 0) return std::optional<PackManifest>();
    return Error(ErrorKind::kIo, path + ": cannot open: " + os_error_text(error));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error(ErrorKind::kIo, path + ": not a regular file");
  }
  if (stamp != nullptr) *stamp = stamp_of(st);
  if (static_cast<std::uint64_t>(st.st_size) > kMaxManifestBytes) {
    ::close(fd);
    return Error(ErrorKind::kFormat, path + ": " + std::to_string(st.st_size) +
                                         " bytes, more than a manifest may have");
  }
  std::vector<std::uint8_t> text(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (got != text.size()) {
    return Error(ErrorKind::kIo, path + ": " + std::to_string(got) + " bytes read of " +
                                     std::to_string(text.size()) + " (shrank while read)");
  }
  auto parsed = parse_pack_manifest(text, path);
  if (!parsed.ok()) return parsed.error();
  return std::optional<PackManifest>(std::move(parsed).value());
}

std::uint64_t write_pack_manifest(const std::string& root, const PackManifest& manifest) {
  const std::string text = pack_manifest_json(manifest);
  const std::span<const std::uint8_t> piece(reinterpret_cast<const std::uint8_t*>(text.data()),
                                            text.size());
  write_file_durably(root + "/" + kPackManifestName, std::span(&piece, 1));
  return text.size();
}

}  // namespace draftfeed
