// Statistics trees (common/stats_tree.h) as JSON for the command line's --json reports: the same
// names as the Python dicts, from the same declarations.
#pragma once

#include <nlohmann/json.hpp>

#include "draftfeed/common/stats_tree.h"

namespace draftfeed::cli {

nlohmann::json stats_json(const StatsTree& tree);

}  // namespace draftfeed::cli
