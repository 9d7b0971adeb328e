#include "draftfeed/hidden/cache_layout.h"

#include <algorithm>
#include <cctype>

#include "draftfeed/common/error.h"

namespace draftfeed {

const char* cache_layout_name(CacheLayout layout) {
  return layout == CacheLayout::kSharded ? "sharded" : "flat";
}

CacheLayout parse_cache_layout(const std::string& text) {
  if (text == "flat") return CacheLayout::kFlat;
  if (text == "sharded") return CacheLayout::kSharded;
  throw Error(ErrorKind::kInvalidArgument,
              "the cache layout is 'flat' (hs_<row>.safetensors) or 'sharded' "
              "(<row // 1000>/hs_<row>.safetensors), got '" +
                  text + "'");
}

std::string default_hidden_states_path(const std::string& data_path) {
  return data_path + "/hidden_states";
}

std::string cache_file_name(std::int64_t row) {
  return "hs_" + std::to_string(row) + ".safetensors";
}

std::string shard_folder_name(std::int64_t row) {
  std::string digits = std::to_string(row / kRowsPerShard);
  if (digits.size() < 4) digits.insert(0, 4 - digits.size(), '0');
  return digits;
}

bool is_shard_folder_name(const std::string& name) {
  return name.size() >= 4 &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string cache_file_path(const std::string& root, std::int64_t row, CacheLayout layout) {
  std::string path = root;
  if (!path.empty() && path.back() != '/') path += '/';
  if (layout == CacheLayout::kSharded) path += shard_folder_name(row) + '/';
  return path + cache_file_name(row);
}

}  // namespace draftfeed
