// The JSON files of a Hugging Face `datasets` folder (state.json, dataset_info.json,
// dataset_dict.json), parsed from their text with bounded nesting, and state.json's shard list.
// A dataset folder may come from anywhere: nothing recursive (printing, copying) ever meets a
// value nested deeper than kMaxJsonDepth (common/json_depth.h), and messages name an entry by its
// place and type, never by printing it. Pure functions: the fuzz target
// (tests/fuzz/dataset_state_fuzz.cc) calls them directly. Thread safety: reentrant.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace draftfeed {

// Parses `text` (from the file `where`, for messages) keeping its key order. Error kFormat naming
// `where`: not JSON, or nested deeper than kMaxJsonDepth.
nlohmann::ordered_json parse_dataset_json(std::string_view text, const std::string& where);

// `state.json["_data_files"][i]["filename"]`, in row order: plain file names in the folder (no
// `/`, not `.` or `..`, not empty). Error kFormat naming `where` and the entry otherwise. An empty
// list is a 0-row dataset saved by datasets 5.
std::vector<std::string> shard_names_from_state_json(std::string_view text,
                                                     const std::string& where);

}  // namespace draftfeed
