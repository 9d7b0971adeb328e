// Statistics trees (common/stats_tree.h) as Python dicts: values, nested dicts for groups, lists
// of dicts for lists. Every stats dict the bindings return is made here.
#pragma once

#include <nanobind/nanobind.h>

#include "draftfeed/common/stats_tree.h"

namespace draftfeed::python {

namespace nb = nanobind;

nb::dict stats_dict(const StatsTree& tree);

}  // namespace draftfeed::python
