// How `quantize` and `pack` report the rows they left as they were: counts by what verify would
// call each file (corrupt, mismatched, nonfinite, locked), with the first examples.
#pragma once

#include <nlohmann/json.hpp>

#include "draftfeed/hidden/cache_scan.h"

namespace draftfeed::cli {

// Sets j["skipped"] (count by status name) and j["examples"] ({status: [{row, reason}]}).
void add_skipped_json(nlohmann::json& j, const ScanCounts& skipped, const ScanExamples& examples);

// "  <label> (<status>) N" and each example's row and reason, for statuses with a count.
void print_skipped(const char* label, const ScanCounts& skipped, const ScanExamples& examples);

}  // namespace draftfeed::cli
