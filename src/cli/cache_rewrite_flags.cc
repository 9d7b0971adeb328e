#include "cache_rewrite_flags.h"

#include <unistd.h>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_layout.h"

namespace draftfeed::cli {

const FlagTable& cache_rewrite_flags_table() {
  static const FlagTable flags{
      {"threads", "N", "threads (default: one per core)"},
      {"examples", "K", "problems listed per kind (default 5)"},
      {"lock-wait", "S",
       "when another rewrite of the folder (pack, unpack, quantize, generate into a pack) holds "
       "its writer lock, wait up to S seconds for it (default 0: refuse at once, naming its host "
       "and pid). Training and verify never wait"},
      {"no-progress", "", "no progress bar"},
  };
  return flags;
}

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
  const std::int64_t threads = args.integer("threads", 0);
  require(threads >= 0 && threads <= 4096, ErrorKind::kInvalidArgument,
          "--threads must be between 0 and 4096, got " + std::to_string(threads));
  const std::int64_t examples = args.integer("examples", 5);
  require(examples >= 0, ErrorKind::kInvalidArgument,
          "--examples must be >= 0, got " + std::to_string(examples));
  const double lock_wait = args.real("lock-wait", 0.0, 0.0);
  require(lock_wait <= 7 * 24 * 3600.0, ErrorKind::kInvalidArgument,
          "--lock-wait must be at most a week (604800 seconds), got " + std::to_string(lock_wait));
  flags.options.target_root = flags.out;
  flags.options.threads = static_cast<unsigned>(threads);
  flags.options.max_examples = static_cast<std::size_t>(examples);
  flags.options.lock_wait = std::chrono::duration<double>(lock_wait);
  flags.json = args.has("json");
  flags.progress_bar = !args.has("no-progress") && !flags.json && ::isatty(STDERR_FILENO);
  return flags;
}

}  // namespace draftfeed::cli
