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
#include "pack_progress.h"

namespace draftfeed::cli {
namespace {

constexpr const char* kUsage =
    R"(usage: draftfeed unpack DATA (--out DIR | --in-place) [--hidden-states DIR] [--threads N]
                       [--no-progress] [--json]

Writes each sample of the packed cache in DIR (default DATA/hidden_states: its manifest.json and
shard files) back as its per-sample file hs_<row>.safetensors, byte for byte as it was packed
(checksums checked, compressed hidden states decoded), in the layout it was packed from. Each file
is written to a temporary file, fsynced and renamed. With --in-place the manifest and the shards
are removed once every file is on disk, leaving the folder as it was before `draftfeed pack`; a
sample that does not read back (corrupt) keeps the pack and exits 1.

  --out DIR            write the per-sample files into DIR (created); the pack stays
  --in-place           write them beside the pack, then remove the pack
  --hidden-states DIR  the packed cache (default DATA/hidden_states)
  --threads N          threads (default: one per core)
  --no-progress        no progress bar
  --json               one JSON object: rows, written, failed, examples, bytes_before,
                       bytes_after, removed_pack, seconds)";

int run_unpack(const std::vector<std::string>& argv) {
  const Args args(argv, {"out", "hidden-states", "threads"}, {"in-place", "no-progress", "json"});
  const CacheRewriteFlags flags = cache_rewrite_flags(args, "unpack", "per-sample files");
  const std::string& hidden = flags.hidden;
  const std::string& out = flags.out;
  const bool in_place = flags.in_place;
  const std::int64_t threads = flags.threads;
  const bool json = flags.json;
  const bool show = flags.progress_bar;
  auto manifest = read_pack_manifest(hidden);
  if (!manifest.ok()) throw manifest.error();
  const std::int64_t total =
      manifest.value() ? static_cast<std::int64_t>(manifest.value()->samples.size()) : 0;
  PackProgress progress;
  UnpackReport report;
  run_with_progress("unpack", total, show, progress, [&] {
    report = unpack_cache(hidden, out, static_cast<unsigned>(threads), 5, &progress);
  });
  if (json) {
    nlohmann::json j;
    j["rows"] = report.rows;
    j["written"] = report.written;
    j["failed"] = report.failed;
    j["examples"] = report.examples;
    j["bytes_before"] = report.bytes_before;
    j["bytes_after"] = report.bytes_after;
    j["removed_pack"] = report.removed_pack;
    j["seconds"] = report.seconds;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("unpack: %lld rows of %s -> %s: %lld written, %lld failed%s\n",
                static_cast<long long>(report.rows), hidden.c_str(),
                in_place ? "(in place)" : out.c_str(), static_cast<long long>(report.written),
                static_cast<long long>(report.failed), report.removed_pack ? "; pack removed" : "");
    for (const auto& example : report.examples) std::printf("      %s\n", example.c_str());
    std::printf("bytes: %s -> %s in %.2f s\n",
                gigabytes(static_cast<double>(report.bytes_before)).c_str(),
                gigabytes(static_cast<double>(report.bytes_after)).c_str(), report.seconds);
  }
  return report.failed == 0 ? 0 : 1;
}

const CommandRegistration registration({"unpack", "turn a packed cache back into per-sample files",
                                        kUsage, run_unpack});

}  // namespace
}  // namespace draftfeed::cli
