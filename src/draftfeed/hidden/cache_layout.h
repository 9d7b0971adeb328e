// Where a row's hidden-state file lies in a cache folder. Two layouts:
//   flat     <root>/hs_<row>.safetensors                  (hs-connectors 0.9.0's FileTransfer)
//   sharded  <root>/<row // 1000, 4 digits>/hs_<row>.safetensors   (draftfeed's own)
// The sharded one keeps folders at 1000 files: on network file systems a folder of a hundred
// thousand files makes every lookup in it slow (SpecForge keeps folders of 2,000 rows for the same
// reason). hs-connectors reads only the flat layout. The shard folder is the row divided by 1000,
// zero-padded to at least four digits (Python's f"{row // 1000:04d}": row 12345 -> "0012", row
// 12,345,678 -> "12345").
// A reader accepts both, file by file (a cache may be half migrated); a writer writes one.
#pragma once

#include <cstdint>
#include <string>

namespace draftfeed {

enum class CacheLayout : std::uint8_t { kFlat, kSharded };
inline constexpr int kCacheLayoutCount = 2;

inline constexpr std::int64_t kRowsPerShard = 1000;

// "flat" or "sharded".
const char* cache_layout_name(CacheLayout layout);
// Throws Error(kInvalidArgument) naming the choices.
CacheLayout parse_cache_layout(const std::string& text);

// The cache folder of a dataset when none is named: `<data_path>/hidden_states` (the reference's
// default, where its FileTransfer writes). The one place the command line, the Loader, the online
// source and the drop-in take it from.
std::string default_hidden_states_path(const std::string& data_path);

// "hs_<row>.safetensors".
std::string cache_file_name(std::int64_t row);
// The shard folder's name for `row` ("0012").
std::string shard_folder_name(std::int64_t row);
// True for a name shard_folder_name can produce: four or more digits.
bool is_shard_folder_name(const std::string& name);
// `<root>/...` for `row` in `layout`.
std::string cache_file_path(const std::string& root, std::int64_t row, CacheLayout layout);

}  // namespace draftfeed
