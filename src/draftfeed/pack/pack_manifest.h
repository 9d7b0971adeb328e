// The manifest of a packed cache (docs/formats.md, "Packed caches"): `<cache>/manifest.json`,
// which names the shard files (`shard-NNNNNN.safetensors`, beside it) and, per sample, the shard,
// the byte range it takes there and the XXH64 of those bytes. A reader trusts the manifest alone:
// a shard file it does not name (a pack killed between a shard's rename and the manifest's) is
// never read.
//
// The manifest is untrusted input: parse_pack_manifest bounds the size (kMaxManifestBytes) and the
// nesting depth before the JSON parser sees it, checks every name (a shard is a bare
// `shard-<6+ digits>.safetensors`, never a path), every number's range, that rows are unique and
// that a shard's samples do not overlap; each refusal names the manifest and the field, sample
// index or row. It is the fuzz target's entry point (tests/fuzz/pack_manifest_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_layout.h"

namespace draftfeed {

inline constexpr const char* kPackManifestName = "manifest.json";
inline constexpr const char* kPackFormat = "draftfeed-pack";
inline constexpr std::int64_t kPackFormatVersion = 1;
inline constexpr std::uint64_t kMaxManifestBytes = 1ULL << 30;

struct PackShard {
  std::string file;         // "shard-000000.safetensors"
  std::uint64_t bytes = 0;  // the file's size when written
};

struct PackEntry {
  std::int64_t row = 0;
  std::uint32_t shard = 0;       // index into PackManifest::shards
  std::uint64_t offset = 0;      // of the sample's first byte, from the start of the shard file
  std::uint64_t length = 0;      // its bytes in the shard (the parts, its file header, padding)
  std::uint64_t checksum = 0;    // XXH64 of those bytes
  std::uint64_t file_bytes = 0;  // the per-sample file's size (unpacked)
  CacheLayout layout = CacheLayout::kFlat;  // where the per-sample file was (unpack puts it back)
};

struct PackManifest {
  std::string codec = "none";  // "none" or "planes-zstd" (pack/plane_codec.h)
  std::vector<PackShard> shards;
  std::vector<PackEntry> samples;  // in packing order: by shard, then offset
  // The disk budget of the writers that keep generated rows in this pack (pack_appender.h), as
  // the last of them wrote it; 0: none said (optional in the file, "budget_bytes").
  std::uint64_t budget_bytes = 0;
};

// "shard-000007.safetensors" (at least six digits, as NeMo Automodel's eagle3 cache).
std::string pack_shard_name(std::uint32_t index);
// True for a name pack_shard_name can produce.
bool is_pack_shard_name(const std::string& name);

// Compact JSON (docs/formats.md).
std::string pack_manifest_json(const PackManifest& manifest);

// Parses and checks `text`; `name` (its path) starts every message. Errors are kFormat.
Result<PackManifest> parse_pack_manifest(std::span<const std::uint8_t> text,
                                         const std::string& name);

// What a manifest file is on disk: a rewrite replaces it by a rename (a new inode), so a reader
// that kept the stamp of the one it read can tell, with one stat, whether the pack changed since.
struct FileStamp {
  bool exists = false;
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// `<root>/manifest.json` read and parsed: nothing when there is none, kIo when unreadable (a
// FIFO, a device or a link to one is refused without blocking). `stamp`, when given, gets the
// stamp of the file read (exists false when there is none).
Result<std::optional<PackManifest>> read_pack_manifest(const std::string& root,
                                                       FileStamp* stamp = nullptr);

// The stamp of `<root>/manifest.json` now (not following a link), from one stat.
FileStamp pack_manifest_stamp(const std::string& root);

// Writes `<root>/manifest.json` durably: a temporary file beside it, fsync, rename, fsync of the
// folder; returns its bytes. Throws Error(kIo) naming the file.
std::uint64_t write_pack_manifest(const std::string& root, const PackManifest& manifest);

}  // namespace draftfeed
