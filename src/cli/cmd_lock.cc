// `draftfeed lock DIR`: who holds a cache folder's writer lock (common/folder_lock.h), and, with
// --hold, holding it: no rewrite of the folder starts meanwhile (a copy or a backup of the cache
// taken while nothing rewrites it; the check that a shared file system forwards the lock between
// hosts, scripts/writer_lock_check.sh).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/common/folder_lock.h"
#include "flag_table.h"

namespace draftfeed::cli {

namespace {

const std::string kUsage =
    R"(usage: draftfeed lock DIR [options]

Says who holds the writer lock of the cache folder DIR (its .draftfeed-writer.lock): the host, the
pid and the command of the rewrite under way (pack, unpack, quantize, generate into a pack, an
online run keeping generated rows in a pack), or that none does. Training and verify never take it.

With --hold, takes the lock (waiting up to --wait seconds for a rewrite under way) and holds it for
SECONDS, or until interrupted: no rewrite of the folder starts meanwhile (they wait their
--lock-wait, then refuse naming this process). It prints "held" once it has the lock. For a copy or
a backup of a cache taken while nothing rewrites it, and for scripts/writer_lock_check.sh, which
checks that a shared file system forwards the lock between hosts.

)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"hold", "SECONDS", "take the lock and hold it this long"},
      {"wait", "SECONDS", "with --hold, how long to wait for another holder (default 0)"},
      {"json", "", "one JSON object: folder, held (bool), host, pid, what, since"},
  };
  return table;
}

const std::string kExit = R"(
Exit status: 0 when the lock is free (or was held by --hold), 1 when another holds it, 2 for bad
arguments.)";

std::atomic<bool> interrupted{false};

void on_signal(int /*signal*/) { interrupted = true; }

int run_lock(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, 1, "one cache folder");
  const std::string folder = args.positionals()[0];
  const bool json = args.has("json");
  if (args.has("hold")) {
    const double hold = args.real("hold", 0.0, 0.0);
    const double wait = args.real("wait", 0.0, 0.0);
    auto lock =
        FolderLock::acquire(folder, "draftfeed lock --hold", std::chrono::duration<double>(wait));
    if (!lock.ok()) throw lock.error();
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::printf("held %s\n", folder.c_str());
    std::fflush(stdout);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(hold);
    while (!interrupted && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return 0;
  }
  const std::optional<LockHolder> holder = folder_lock_holder(folder);
  if (json) {
    nlohmann::json out = {{"folder", folder}, {"held", holder.has_value()}};
    if (holder) {
      out["host"] = holder->host;
      out["pid"] = holder->pid;
      out["what"] = holder->what;
      out["since"] = holder->since;
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else if (holder) {
    std::printf("%s: writer lock held by %s\n", folder.c_str(), holder->text().c_str());
  } else {
    std::printf("%s: writer lock free\n", folder.c_str());
  }
  return holder ? 1 : 0;
}

const CommandRegistration kRegistration({"lock", "who holds a cache folder's writer lock; hold it",
                                         kUsage + command_flags().help() + kExit, run_lock});

}  // namespace

}  // namespace draftfeed::cli
