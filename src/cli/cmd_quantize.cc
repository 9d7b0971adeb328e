// `draftfeed quantize DATA (--out DIR | --in-place)`: converts a bf16 hidden-state cache to
// hs-connectors' FP8 files (hidden/fp8_convert.h), with a progress bar and the bytes before and
// after.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "args.h"
#include "cache_rewrite_flags.h"
#include "command.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/fp8_convert.h"
#include "flag_table.h"
#include "rewrite_progress.h"
#include "row_range.h"
#include "skip_report.h"
#include "stats_json.h"

namespace draftfeed::cli {
namespace {

const std::string kUsage = std::string(
    R"(usage: draftfeed quantize DATA (--out DIR | --in-place) [options]

Converts DATA's hidden-state cache (DIR/hs_<row>.safetensors, default DATA/hidden_states) to the FP8
files hs-connectors' FP8HiddenStatesConnector writes: hidden_states float8_e4m3fn [T, L, H],
hidden_states_scales float32 [T, 1, 1] (one scale per token: amax / 448) and token_ids. They take
about half the bytes; FP8Transfer reads them, and so does draftfeed, which dequantizes them in its
batch copy exactly as FP8Transfer does.

Each file is checked first, as `draftfeed verify` checks it; a file that fails (corrupt, mismatched,
non-finite, or locked by its writer) is left as it is and counted. Every new file is written beside
its target and renamed over it, so readers see the old file or the new one, never half a file.
Resumable: files that are already FP8 are kept, so running it again after an interruption finishes
what is left. A cache that mixes bf16 and FP8 files (half converted) is fine to train from.
Quantize holds the writer lock of the folder it writes while it runs (docs/formats.md, "The writer
lock"): one rewrite of a folder at a time. Rows of a pack (`draftfeed pack`) have no per-sample
file and are counted as missing: unpack the pack first to quantize them.

)");

const FlagTable& command_flags() {
  static const FlagTable table =
      FlagTable{
          {"out", "DIR",
           "write the FP8 cache into DIR (created); the source cache is left as it is"},
          {"in-place", "",
           "replace each bf16/f16/f32 file by its FP8 file (lossy: the bf16 values are gone; keep "
           "a copy if you may need them)"},
          {"hidden-states", "DIR",
           "the source cache (default DATA/hidden_states; files in either layout)"},
          {"layout", "flat|sharded",
           "where the FP8 files go: flat (DIR/hs_<row>.safetensors) or sharded (DIR/<row // 1000, "
           "4 digits>/hs_<row>.safetensors, draftfeed's layout for large caches). Default: into "
           "--out, flat; in place, each file stays where it is (with --layout, files of the other "
           "layout move: the cache ends in one)"},
          {"rows", "A:B", "only rows A..B-1 (either side may be left out)"},
          {"fsync", "",
           "fsync each file before its rename (always done with --in-place, where the new file "
           "replaces the only copy)"},
      }
          .add(cache_rewrite_flags_table())
          .add({"json", "",
                "one JSON object: rows, converted, already_fp8, copied, missing, skipped (by "
                "kind), bytes_before, bytes_after, ratio, seconds, threads, examples, "
                "lock_wait_seconds"});
  return table;
}

const std::string kExit = R"(
Exit status: 0 when every row with a valid file has its FP8 file, 1 when some files were left
unconverted (or another rewrite holds the folder), 2 for bad arguments.)";

int run_quantize(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  const CacheRewriteFlags flags = cache_rewrite_flags(args, "quantize", "a new FP8 cache");

  const auto dataset = TokenDataset::open(flags.data);
  const RowRange range = parse_row_range(args.str("rows", ""), dataset->num_rows());
  CacheStoreOptions store_options;
  store_options.root = flags.hidden;
  store_options.lock_mode = LockMode::kProbe;  // never wait for, nor remove, a writer's lock
  const CacheStore store(store_options);

  CacheConvertOptions options;
  options.rewrite = flags.options;
  options.fsync = args.has("fsync");
  if (args.has("layout")) options.layout = args.parsed("layout", "", parse_cache_layout);
  CacheRewriteProgress progress;
  CacheConvertReport report;
  run_with_progress("quantize", range.end - range.begin, flags.progress_bar, progress, [&] {
    report = convert_cache_to_fp8(
        store, range.begin, range.end,
        [&dataset](std::int64_t row) { return RowIds(dataset->input_ids(row)); }, options,
        &progress);
  });
  if (flags.json) {
    nlohmann::json j;
    add_rewrite_json(j, report);
    j.update(stats_json(stats_tree(report)));
    j["source"] = flags.hidden;
    j["target"] = flags.in_place ? flags.hidden : flags.out;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("quantize: %lld rows of %s -> %s\n", static_cast<long long>(report.rows),
                flags.hidden.c_str(), flags.in_place ? "(in place)" : flags.out.c_str());
    std::printf("  converted   %lld\n  already fp8 %lld\n  copied fp8  %lld\n  missing     %lld\n",
                static_cast<long long>(report.converted),
                static_cast<long long>(report.already_fp8), static_cast<long long>(report.copied),
                static_cast<long long>(report.missing));
    if (report.moved > 0) {
      std::printf("  moved       %lld (FP8 files renamed into the %s layout)\n",
                  static_cast<long long>(report.moved), cache_layout_name(*options.layout));
    }
    print_skipped("skipped", report.skipped, report.examples);
    print_rewrite_bytes(report);
  }
  return report.skipped_total() == 0 ? 0 : 1;
}

const CommandRegistration registration({"quantize",
                                        "convert a hidden-state cache to hs-connectors' FP8 files",
                                        kUsage + command_flags().help() + kExit, run_quantize});

}  // namespace
}  // namespace draftfeed::cli
