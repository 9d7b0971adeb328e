#include "stats_json.h"

#include <variant>

namespace draftfeed::cli {

nlohmann::json stats_json(const StatsTree& tree) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : tree.values) {
    out[name] = std::visit([](const auto& v) { return nlohmann::json(v); }, value);
  }
  for (const StatsTree::Group& group : tree.groups) out[group.name] = stats_json(group.tree);
  for (const StatsTree::List& list : tree.lists) {
    nlohmann::json items = nlohmann::json::array();
    for (const StatsTree& item : list.items) items.push_back(stats_json(item));
    out[list.name] = items;
  }
  return out;
}

}  // namespace draftfeed::cli
