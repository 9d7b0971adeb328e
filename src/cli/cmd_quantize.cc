// `draftfeed quantize DATA (--out DIR | --in-place)`: converts a bf16 hidden-state cache to
// hs-connectors' FP8 files (hidden/fp8_convert.h), with a progress bar and the bytes before and
// after.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "args.h"
#include "cache_rewrite_flags.h"
#include "command.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/fp8_convert.h"
#include "row_range.h"
#include "skip_report.h"

namespace draftfeed::cli {
namespace {

constexpr const char* kUsage =
    R"(usage: draftfeed quantize DATA (--out DIR | --in-place) [--hidden-states DIR] [--threads N]
                         [--rows A:B] [--layout flat|sharded] [--fsync] [--examples K]
                         [--no-progress] [--json]

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

  --out DIR            write the FP8 cache into DIR (created); the source cache is left as it is
  --in-place           replace each bf16/f16/f32 file by its FP8 file (lossy: the bf16 values are
                       gone; keep a copy if you may need them)
  --hidden-states DIR  the source cache (default DATA/hidden_states; files in either layout)
  --layout L           where the FP8 files go: flat (DIR/hs_<row>.safetensors) or sharded
                       (DIR/<row // 1000, 4 digits>/hs_<row>.safetensors, draftfeed's layout for
                       large caches). Default: into --out, flat; in place, each file stays where it
                       is (with --layout, files of the other layout move: the cache ends in one)
  --threads N          converting threads (default: one per core)
  --rows A:B           only rows A..B-1 (either side may be left out)
  --fsync              fsync each file before its rename (always done with --in-place, where
                       the new file replaces the only copy)
  --examples K         problems listed per kind (default 5)
  --no-progress        no progress bar
  --json               one JSON object: rows, converted, already_fp8, copied, missing, skipped (by
                       kind), bytes_before, bytes_after, ratio, seconds, threads, examples

Exit status: 0 when every row with a valid file has its FP8 file, 1 when some files were left
unconverted, 2 for bad arguments.)";

std::string gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f GB", bytes / 1e9);
  return text;
}

void draw(const CacheConvertProgress& p, std::int64_t total, double seconds) {
  constexpr int kWidth = 30;
  const std::int64_t done = p.rows_done.load();
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const double before = static_cast<double>(p.bytes_before.load());
  std::fprintf(stderr, "\rquantize [%s] %lld/%lld rows  %s -> %s  %.0f MB/s read  ", bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), gb(before).c_str(),
               gb(static_cast<double>(p.bytes_after.load())).c_str(),
               seconds > 0 ? before / 1e6 / seconds : 0.0);
  std::fflush(stderr);
}

int run_quantize(const std::vector<std::string>& argv) {
  const Args args(argv, {"out", "hidden-states", "threads", "rows", "examples", "layout"},
                  {"in-place", "fsync", "no-progress", "json"});
  const CacheRewriteFlags flags = cache_rewrite_flags(args, "quantize", "a new FP8 cache");
  const std::string& data = flags.data;
  const std::string& hidden = flags.hidden;
  const std::string& out = flags.out;
  const bool in_place = flags.in_place;
  const std::int64_t threads = flags.threads;
  const std::int64_t examples = args.integer("examples", 5);
  require(examples >= 0, ErrorKind::kInvalidArgument,
          "--examples must be >= 0, got " + std::to_string(examples));
  const bool json = flags.json;
  const bool progress_bar = flags.progress_bar;

  const auto dataset = TokenDataset::open(data);
  const RowRange range = parse_row_range(args.str("rows", ""), dataset->num_rows());
  CacheStoreOptions store_options;
  store_options.root = hidden;
  store_options.lock_mode = LockMode::kProbe;  // never wait for, nor remove, a writer's lock
  const CacheStore store(store_options);

  CacheConvertOptions options;
  options.target_root = out;
  options.threads = static_cast<unsigned>(threads);
  options.fsync = args.has("fsync");
  if (args.has("layout")) options.layout = args.parsed("layout", "", parse_cache_layout);
  options.max_examples = static_cast<std::size_t>(examples);
  CacheConvertProgress progress;
  CacheConvertReport report;
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error;  // from the converting thread, rethrown here
  std::thread converter([&] {
    try {
      report = convert_cache_to_fp8(
          store, range.begin, range.end,
          [&dataset](std::int64_t row) { return RowIds(dataset->input_ids(row)); }, options,
          &progress);
    } catch (...) {
      error = std::current_exception();
      progress.rows_done = range.end - range.begin;  // ends the progress loop
    }
  });
  const std::int64_t total = range.end - range.begin;
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (progress_bar && progress.rows_done.load() < total) {
    draw(progress, total, seconds());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  converter.join();
  if (progress_bar) {
    draw(progress, total, seconds());
    std::fprintf(stderr, "\n");
  }
  if (error) std::rethrow_exception(error);

  const double ratio = report.bytes_before > 0 ? static_cast<double>(report.bytes_after) /
                                                     static_cast<double>(report.bytes_before)
                                               : 0.0;
  if (json) {
    nlohmann::json j;
    j["rows"] = report.rows;
    j["converted"] = report.converted;
    j["already_fp8"] = report.already_fp8;
    j["moved"] = report.moved;
    j["copied"] = report.copied;
    j["missing"] = report.missing;
    add_skipped_json(j, report.skipped, report.examples);
    j["bytes_before"] = report.bytes_before;
    j["bytes_after"] = report.bytes_after;
    j["ratio"] = ratio;
    j["seconds"] = report.seconds;
    j["threads"] = report.threads;
    j["source"] = hidden;
    j["target"] = in_place ? hidden : out;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("quantize: %lld rows of %s -> %s\n", static_cast<long long>(report.rows),
                hidden.c_str(), in_place ? "(in place)" : out.c_str());
    std::printf("  converted   %lld\n  already fp8 %lld\n  copied fp8  %lld\n  missing     %lld\n",
                static_cast<long long>(report.converted),
                static_cast<long long>(report.already_fp8), static_cast<long long>(report.copied),
                static_cast<long long>(report.missing));
    if (report.moved > 0) {
      std::printf("  moved       %lld (FP8 files renamed into the %s layout)\n",
                  static_cast<long long>(report.moved), cache_layout_name(*options.layout));
    }
    print_skipped("skipped", report.skipped, report.examples);
    std::printf("bytes: %s -> %s (%.1f%%) in %.2f s on %u threads\n",
                gb(static_cast<double>(report.bytes_before)).c_str(),
                gb(static_cast<double>(report.bytes_after)).c_str(), 100.0 * ratio, report.seconds,
                report.threads);
  }
  return report.skipped_total() == 0 ? 0 : 1;
}

const CommandRegistration registration({"quantize",
                                        "convert a hidden-state cache to hs-connectors' FP8 files",
                                        kUsage, run_quantize});

}  // namespace
}  // namespace draftfeed::cli
