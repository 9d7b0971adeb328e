// The flags every command that rewrites a cache shares (`quantize`, `pack`, `unpack`): DATA, its
// cache folder (--hidden-states), where the result goes (exactly one of --out DIR and --in-place),
// --threads, and how it reports (--json, --no-progress). Checked once, errors naming the flags.
#pragma once

#include <cstdint>
#include <string>

#include "args.h"

namespace draftfeed::cli {

struct CacheRewriteFlags {
  std::string data;
  std::string hidden;  // --hidden-states, default <DATA>/hidden_states
  std::string out;     // empty with --in-place
  bool in_place = false;
  std::int64_t threads = 0;  // 0: every core
  bool json = false;
  bool progress_bar = false;  // a terminal, and neither --json nor --no-progress
};

// `out_help` says what --out makes, for the error when neither or both are given.
CacheRewriteFlags cache_rewrite_flags(const Args& args, const std::string& command,
                                      const std::string& out_help);

}  // namespace draftfeed::cli
