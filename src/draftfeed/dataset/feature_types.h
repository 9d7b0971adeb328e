// Column types from a `dataset_info.json` "features" object, for a dataset with no shard to read
// them from (datasets 5 saves a 0-row dataset with an empty `_data_files` list).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {

// Maps datasets' feature descriptions to the Arrow type text the reader reports: Value(dtype) ->
// "int64", "float", "string"...; List / Sequence -> "list<T>" (with a length: fixed_size_list);
// LargeList -> "large_list<T>"; a dict -> "struct<k: T, ...>"; [T] -> "list<T>"; ClassLabel ->
// "int64"; anything else -> "unknown(<_type>)".
std::vector<ColumnInfo> columns_from_features(const nlohmann::ordered_json& features);

}  // namespace draftfeed
