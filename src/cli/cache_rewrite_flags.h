// The flags every command that rewrites a cache shares (`quantize`, `pack`, `unpack`): DATA, its
// cache folder (--hidden-states), where the result goes (exactly one of --out DIR and --in-place),
// --threads, --examples, --lock-wait, and how it reports (--json, --no-progress). Checked once,
// errors naming the flags; turned into the library's CacheRewriteOptions (hidden/cache_rewrite.h).
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "args.h"
#include "draftfeed/hidden/cache_rewrite.h"
#include "flag_table.h"

namespace draftfeed::cli {

// --threads, --examples, --lock-wait and --no-progress, to add to a command's table after its own
// --out, --in-place, --hidden-states and --json (whose help is the command's: what it writes).
const FlagTable& cache_rewrite_flags_table();

struct CacheRewriteFlags {
  std::string data;
  std::string hidden;  // --hidden-states, default <DATA>/hidden_states
  std::string out;     // empty with --in-place
  bool in_place = false;
  bool json = false;
  bool progress_bar = false;    // a terminal, and neither --json nor --no-progress
  CacheRewriteOptions options;  // --out, --threads, --examples, --lock-wait
};

// `out_help` says what --out makes, for the error when neither or both are given.
CacheRewriteFlags cache_rewrite_flags(const Args& args, const std::string& command,
                                      const std::string& out_help);

}  // namespace draftfeed::cli
