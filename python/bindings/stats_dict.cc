#include "stats_dict.h"

#include <nanobind/stl/string.h>

#include <variant>

namespace draftfeed::python {

nb::dict stats_dict(const StatsTree& tree) {
  nb::dict out;
  for (const auto& [name, value] : tree.values) {
    out[name.c_str()] = std::visit([](const auto& v) { return nb::cast(v); }, value);
  }
  for (const auto& [name, group] : tree.groups) out[name.c_str()] = stats_dict(group);
  for (const auto& [name, items] : tree.lists) {
    nb::list list;
    for (const StatsTree& item : items) list.append(stats_dict(item));
    out[name.c_str()] = list;
  }
  return out;
}

}  // namespace draftfeed::python
