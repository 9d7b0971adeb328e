#include "draftfeed/dataset/dataset_state.h"

#include "draftfeed/common/error.h"
#include "draftfeed/common/json_depth.h"

namespace draftfeed {

using Json = nlohmann::ordered_json;

Json parse_dataset_json(std::string_view text, const std::string& where) {
  if (!json_depth_within(text))
    throw Error(ErrorKind::kFormat, where + ": " + json_too_deep_text());
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw Error(ErrorKind::kFormat, where + ": not valid JSON: " + error.what());
  }
}

std::vector<std::string> shard_names_from_state_json(std::string_view text,
                                                     const std::string& where) {
  const Json state = parse_dataset_json(text, where);
  if (!state.is_object() || !state.contains("_data_files") || !state["_data_files"].is_array()) {
    throw Error(ErrorKind::kFormat, where + ": no '_data_files' list");
  }
  std::vector<std::string> names;
  std::size_t index = 0;
  for (const auto& entry : state["_data_files"]) {
    if (!entry.is_object() || !entry.contains("filename") || !entry["filename"].is_string()) {
      throw Error(ErrorKind::kFormat,
                  where + ": a '_data_files' entry has no 'filename' string (entry " +
                      std::to_string(index) + ", " + entry.type_name() + ")");
    }
    const std::string name = entry["filename"].get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw Error(ErrorKind::kFormat,
                  where + ": shard name '" + name + "' is not a plain file name in the folder");
    }
    names.push_back(name);
    ++index;
  }
  return names;
}

}  // namespace draftfeed
