#include "stats_dict.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <variant>

namespace draftfeed::python {

nb::dict stats_dict(const StatsTree& tree) {
  nb::dict out;
  for (const auto& [name, value] : tree.values) {
    out[name.c_str()] = std::visit([](const auto& v) { return nb::cast(v); }, value);
  }
  for (const StatsTree::Group& group : tree.groups)
    out[group.name.c_str()] = stats_dict(group.tree);
  for (const StatsTree::List& list : tree.lists) {
    nb::list items;
    for (const StatsTree& item : list.items) items.append(stats_dict(item));
    out[list.name.c_str()] = items;
  }
  return out;
}

}  // namespace draftfeed::python
