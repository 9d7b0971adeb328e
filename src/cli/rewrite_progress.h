// What the cache rewrites of the command line (`pack`, `unpack`, `quantize`) share in how they run
// and report: the progress bar, and the report's common lines and JSON fields.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "draftfeed/hidden/cache_rewrite.h"

namespace draftfeed::cli {

// Runs `work` on a thread of its own and, when `show`, redraws rows done and bytes before ->
// after on stderr every 200 ms until it ends. Exceptions from `work` are rethrown here; the writer
// lock's refusal (another rewrite holds the folder) says which flag waits for it.
void run_with_progress(const char* verb, std::int64_t total, bool show,
                       CacheRewriteProgress& progress, const std::function<void()>& work);

// "1.234 GB"
std::string gigabytes(double bytes);

// after / before, 0 when nothing was before.
double byte_ratio(std::uint64_t after, std::uint64_t before);

// The common fields: rows, skipped and examples (by kind), bytes_before, bytes_after, ratio,
// seconds, threads, lock_wait_seconds.
void add_rewrite_json(nlohmann::json& j, const CacheRewriteReport& report);

// "bytes: 1.000 GB -> 0.680 GB (68.0%<extra>) in 1.23 s on 2 threads"
void print_rewrite_bytes(const CacheRewriteReport& report, const std::string& extra = "");

}  // namespace draftfeed::cli
