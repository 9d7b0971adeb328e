// `draftfeed unpack DATA (--out DIR | --in-place)`: a packed cache back into per-sample files,
// byte for byte (pack/pack_writer.h).
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "args.h"
#include "cache_rewrite_flags.h"
#include "command.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/pack/pack_manifest.h"
#include "draftfeed/pack/pack_writer.h"
#include "flag_table.h"
#include "rewrite_progress.h"
#include "skip_report.h"
#include "stats_json.h"

namespace draftfeed::cli {
namespace {

const std::string kUsage = std::string(
    R"(usage: draftfeed unpack DATA (--out DIR | --in-place) [options]

Writes each sample of the packed cache in DIR (default DATA/hidden_states: its manifest.json and
shard files) back as its per-sample file hs_<row>.safetensors, byte for byte as it was packed
(checksums checked, compressed hidden states decoded), in the layout it was packed from. Each file
is written to a temporary file, fsynced and renamed. With --in-place the manifest and the shards
are removed once every file is on disk, leaving the folder as it was before `draftfeed pack`; a
sample that does not read back (corrupt) keeps the pack and exits 1. Unpack holds the writer lock
of the folder it writes (in place, the pack's own) while it runs (docs/formats.md, "The writer
lock"); loaders running meanwhile keep reading the shards they hold until their epoch ends, and
read the per-sample files from their next epoch.

)");

const FlagTable& command_flags() {
  static const FlagTable table =
      FlagTable{
          {"out", "DIR", "write the per-sample files into DIR (created); the pack stays"},
          {"in-place", "", "write them beside the pack, then remove the pack"},
          {"hidden-states", "DIR", "the packed cache (default DATA/hidden_states)"},
      }
          .add(cache_rewrite_flags_table())
          .add({"json", "",
                "one JSON object: rows, written, failed, skipped and examples (by kind), "
                "bytes_before, bytes_after, ratio, removed_pack, seconds, lock_wait_seconds"});
  return table;
}

int run_unpack(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  const CacheRewriteFlags flags = cache_rewrite_flags(args, "unpack", "per-sample files");
  auto manifest = read_pack_manifest(flags.hidden);
  if (!manifest.ok()) throw manifest.error();
  const std::int64_t total =
      manifest.value() ? static_cast<std::int64_t>(manifest.value()->samples.size()) : 0;
  CacheRewriteProgress progress;
  UnpackReport report;
  run_with_progress("unpack", total, flags.progress_bar, progress,
                    [&] { report = unpack_cache(flags.hidden, flags.options, &progress); });
  if (flags.json) {
    nlohmann::json j;
    add_rewrite_json(j, report);
    j.update(stats_json(stats_tree(report)));
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("unpack: %lld rows of %s -> %s: %lld written, %lld failed%s\n",
                static_cast<long long>(report.rows), flags.hidden.c_str(),
                flags.in_place ? "(in place)" : flags.out.c_str(),
                static_cast<long long>(report.written), static_cast<long long>(report.failed()),
                report.removed_pack ? "; pack removed" : "");
    print_skipped("not written", report.skipped, report.examples);
    print_rewrite_bytes(report);
  }
  return report.failed() == 0 ? 0 : 1;
}

const CommandRegistration registration({"unpack", "turn a packed cache back into per-sample files",
                                        kUsage + command_flags().help(), run_unpack});

}  // namespace
}  // namespace draftfeed::cli
