#include "stats_json.h"

#include <variant>

namespace draftfeed::cli {

nlohmann::json stats_json(const StatsTree& tree) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : tree.values) {
    out[name] = std::visit([](const auto& v) { return nlohmann::json(v); }, value);
  }
  for (const auto& [name, group] : tree.groups) out[name] = stats_json(group);
  for (const auto& [name, items] : tree.lists) {
    nlohmann::json list = nlohmann::json::array();
    for (const StatsTree& item : items) list.push_back(stats_json(item));
    out[name] = list;
  }
  return out;
}

}  // namespace draftfeed::cli
