#include "draftfeed/dataset/feature_types.h"

#include <string>

namespace draftfeed {

namespace {

std::string value_type(const std::string& dtype) {
  // datasets names floats by width; Arrow's text (and the reader's) does not.
  if (dtype == "float16") return "halffloat";
  if (dtype == "float32") return "float";
  if (dtype == "float64") return "double";
  return dtype;
}

std::string feature_type(const nlohmann::ordered_json& feature, int depth) {
  if (depth > 64) return "unknown(too deep)";
  if (feature.is_array()) {
    return feature.empty() ? "unknown(list)" : "list<" + feature_type(feature[0], depth + 1) + ">";
  }
  if (!feature.is_object()) return "unknown";
  const auto kind = feature.find("_type");
  if (kind == feature.end() || !kind->is_string()) {
    std::string fields;
    for (const auto& [name, child] : feature.items()) {
      fields += (fields.empty() ? "" : ", ") + name + ": " + feature_type(child, depth + 1);
    }
    return "struct<" + fields + ">";
  }
  const std::string type = kind->get<std::string>();
  auto inner = [&]() {
    const auto child = feature.find("feature");
    return child == feature.end() ? std::string("unknown") : feature_type(*child, depth + 1);
  };
  if (type == "Value") {
    const auto dtype = feature.find("dtype");
    return dtype != feature.end() && dtype->is_string() ? value_type(dtype->get<std::string>())
                                                        : "unknown(Value)";
  }
  if (type == "List" || type == "Sequence") {
    const auto length = feature.find("length");
    if (length != feature.end() && length->is_number_integer() && length->get<long long>() >= 0) {
      return "fixed_size_list<" + inner() + ">[" + std::to_string(length->get<long long>()) + "]";
    }
    return "list<" + inner() + ">";
  }
  if (type == "LargeList") return "large_list<" + inner() + ">";
  if (type == "ClassLabel") return "int64";
  return "unknown(" + type + ")";
}

}  // namespace

std::vector<ColumnInfo> columns_from_features(const nlohmann::ordered_json& features) {
  std::vector<ColumnInfo> columns;
  if (!features.is_object()) return columns;
  for (const auto& [name, feature] : features.items()) {
    columns.push_back({name, feature_type(feature, 0)});
  }
  return columns;
}

}  // namespace draftfeed
