#include "cache_rewrite_flags.h"

#include <unistd.h>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_layout.h"

namespace draftfeed::cli {

CacheRewriteFlags cache_rewrite_flags(const Args& args, const std::string& command,
                                      const std::string& out_help) {
  args.expect_positionals(1, 1, "one dataset folder");
  CacheRewriteFlags flags;
  flags.data = args.positionals()[0];
  flags.hidden = args.str("hidden-states", default_hidden_states_path(flags.data));
  flags.out = args.str("out", "");
  flags.in_place = args.has("in-place");
  require(flags.in_place != !flags.out.empty(), ErrorKind::kInvalidArgument,
          command + " needs exactly one of --out DIR (" + out_help + ") and --in-place");
  flags.threads = args.integer("threads", 0);
  require(flags.threads >= 0 && flags.threads <= 4096, ErrorKind::kInvalidArgument,
          "--threads must be between 0 and 4096, got " + std::to_string(flags.threads));
  flags.json = args.has("json");
  flags.progress_bar = !args.has("no-progress") && !flags.json && ::isatty(STDERR_FILENO);
  return flags;
}

}  // namespace draftfeed::cli
