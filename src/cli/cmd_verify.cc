// `draftfeed verify DATA`: checks every row's cached hidden states against the dataset, in
// parallel, and reports counts by outcome and the scan speed.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "args.h"
#include "command.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/cache_scan.h"
#include "draftfeed/pack/pack_verify.h"
#include "flag_table.h"

namespace draftfeed::cli {

namespace {

const std::string kUsage =
    R"(usage: draftfeed verify DATA [options]

Checks DATA's cached hidden states (DIR/hs_<row>.safetensors, default DATA/hidden_states, or
draftfeed's sharded layout DIR/<row // 1000, 4 digits>/hs_<row>.safetensors: each row's file is
looked for in both, and the counts say how many were found in each) against the dataset rows: file layout, token ids, shape, dtype and finiteness. Counts ok, missing, corrupt
(unreadable), mismatched (token ids or length), nonfinite and locked files and lists the first K
(default 5) of each problem. A file whose writer holds its `.lock` is counted as locked at once:
verify never waits and never removes a lock file (a stale lock without a holder is left in place and
its data file checked).

A packed cache (DIR/manifest.json, `draftfeed pack`) is checked too: every sample the manifest names
is read back from its shard (checksum, compressed parts decoded) and checked the same way, a problem
naming the shard, the offset and the row. A row is counted by what a loader would read: its
packed sample, or, when that fails, its per-sample file (one `draftfeed generate` wrote to repair
it): such rows count as ok and are listed as fallbacks, with why their packed sample fails. The
baselines read per-sample files only. Verify takes no lock: it never waits for a rewrite, nor
holds one up.

)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"hidden-states", "DIR", "the cache (default DATA/hidden_states)"},
      {"threads", "N", "scanning threads (default: one per core)"},
      {"examples", "K", "problems listed per kind (default 5)"},
      {"json", "",
       "one JSON object: rows, ok, missing, corrupt, mismatched, nonfinite, locked, bytes, "
       "layouts (flat, sharded), packed (samples, shards, compressed, packed_ok, fallbacks, "
       "fallback_examples, budget: bytes, used, share, kept_rows, not_kept_rows), seconds, "
       "gb_per_s, threads, examples"},
      {"baseline", "memcpy|read|pread",
       "measure instead of validating: memcpy, a plain memcpy of every file (the bound for "
       "anything that copies every byte once, as a loader does);\nread, a read-only pass over "
       "every byte of every file (the bound for anything that reads every byte once without "
       "copying, as verify does);\npread, a read of every file through its descriptor into a 64 "
       "MiB ring of destinations (the kernel's copy out of the page cache: the bound for a loader "
       "that reads page-cache files through read())"},
  };
  return table;
}

const std::string kExit = R"(
Exit status: 0 when every file is ok or missing, 1 otherwise (2 for bad arguments).)";

std::string gb_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", bytes / 1e9);
  return text;
}

// A pack's budget (the writers that keep generated rows: pack/pack_appender.h) and how much of it
// the pack takes: its shards and manifest, against the budget the last of them wrote.
nlohmann::json budget_json(const PackedCache& pack, const CacheScanReport& report) {
  std::uint64_t used = 0;
  for (const PackShard& shard : pack.manifest().shards) used += shard.bytes;
  std::error_code ec;
  const auto manifest_size = std::filesystem::file_size(pack.root() + "/" + kPackManifestName, ec);
  if (!ec) used += manifest_size;
  const std::uint64_t limit = pack.manifest().budget_bytes;
  const auto kept = static_cast<std::int64_t>(pack.manifest().samples.size());
  return {{"bytes", limit},
          {"used", used},
          {"share", limit > 0 ? static_cast<double>(used) / static_cast<double>(limit) : 0.0},
          {"kept_rows", kept},
          {"not_kept_rows", report.counts[static_cast<std::size_t>(ScanStatus::kMissing)]}};
}

int run_verify(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, 1, "one dataset folder");
  const std::string data = args.positionals()[0];
  const std::string hidden = args.str("hidden-states", default_hidden_states_path(data));
  const std::int64_t threads = args.integer("threads", 0);
  const std::int64_t examples = args.integer("examples", 5);
  const std::string baseline = args.str("baseline", "");
  require(threads >= 0 && threads <= 4096, ErrorKind::kInvalidArgument,
          "--threads must be between 0 and 4096, got " + std::to_string(threads));
  require(examples >= 0, ErrorKind::kInvalidArgument,
          "--examples must be >= 0, got " + std::to_string(examples));
  require(baseline.empty() || baseline == "memcpy" || baseline == "read" || baseline == "pread",
          ErrorKind::kInvalidArgument,
          "--baseline must be 'memcpy', 'read' or 'pread', got '" + baseline + "'");

  const auto dataset = TokenDataset::open(data);
  CacheStoreOptions store_options;
  store_options.root = hidden;
  store_options.lock_mode = LockMode::kProbe;
  const CacheStore store(store_options);

  auto opened = PackedCache::open(hidden);
  if (!opened.ok()) throw opened.error();
  const std::shared_ptr<const PackedCache> pack = opened.value();

  CacheScanOptions options;
  if (pack != nullptr) {
    options.skip_row = [&pack](std::int64_t row) { return pack->find(row) != nullptr; };
  }
  options.threads = static_cast<unsigned>(threads);
  options.max_examples = static_cast<std::size_t>(examples);
  options.mode = baseline.empty()       ? ScanMode::kValidate
                 : baseline == "memcpy" ? ScanMode::kMemcpy
                 : baseline == "pread"  ? ScanMode::kPread
                                        : ScanMode::kRead;
  const auto ids_of_row = [&dataset](std::int64_t row) { return RowIds(dataset->input_ids(row)); };
  CacheScanReport report = scan_cache(store, dataset->num_rows(), ids_of_row, options);
  PackVerifyReport packed;
  if (pack != nullptr && options.mode == ScanMode::kValidate) {
    packed = verify_pack(*pack, dataset->num_rows(), ids_of_row, options.threads,
                         options.max_examples, &store);
    merge_by_status(report.counts, report.examples, packed.scan.counts, packed.scan.examples);
    keep_lowest_examples(report.examples, options.max_examples);
    report.bytes += packed.scan.bytes;
    report.seconds += packed.scan.seconds;
  }
  const double gb_per_s =
      report.seconds > 0 ? static_cast<double>(report.bytes) / 1e9 / report.seconds : 0.0;

  if (args.has("json")) {
    nlohmann::json out;
    out["rows"] = report.rows;
    for (std::size_t s = 0; s < kScanStatusCount; ++s) {
      out[scan_status_name(static_cast<ScanStatus>(s))] = report.counts[s];
    }
    out["bytes"] = report.bytes;
    for (int l = 0; l < kCacheLayoutCount; ++l) {
      out["layouts"][cache_layout_name(static_cast<CacheLayout>(l))] =
          report.layouts[static_cast<std::size_t>(l)];
    }
    nlohmann::json fallbacks = nlohmann::json::array();
    for (const auto& example : packed.fallback_examples) {
      fallbacks.push_back({{"row", example.row}, {"reason", example.reason}});
    }
    out["packed"] = {{"samples", packed.samples},       {"shards", packed.shards},
                     {"compressed", packed.compressed}, {"packed_ok", packed.packed_ok},
                     {"fallbacks", packed.fallbacks},   {"fallback_examples", fallbacks}};
    if (pack != nullptr && pack->manifest().budget_bytes > 0) {
      out["packed"]["budget"] = budget_json(*pack, report);
    }
    out["seconds"] = report.seconds;
    out["gb_per_s"] = gb_per_s;
    out["threads"] = report.threads;
    out["mode"] = baseline.empty() ? "validate" : baseline;
    if (options.mode == ScanMode::kRead) out["read_checksum"] = report.read_checksum;
    out["hidden_states"] = hidden;
    nlohmann::json listed = nlohmann::json::object();
    for (std::size_t s = 0; s < kScanStatusCount; ++s) {
      if (report.examples[s].empty()) continue;
      auto& list = listed[scan_status_name(static_cast<ScanStatus>(s))];
      for (const auto& example : report.examples[s]) {
        list.push_back({{"row", example.row}, {"reason", example.reason}});
      }
    }
    out["examples"] = listed;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("verify: %lld rows, hidden states in %s%s\n", static_cast<long long>(report.rows),
                hidden.c_str(), baseline.empty() ? "" : (" (" + baseline + " baseline)").c_str());
    for (std::size_t s = 0; s < kScanStatusCount; ++s) {
      std::printf("  %-10s %lld\n", scan_status_name(static_cast<ScanStatus>(s)),
                  static_cast<long long>(report.counts[s]));
      for (const auto& example : report.examples[s]) {
        std::printf("      row %lld: %s\n", static_cast<long long>(example.row),
                    example.reason.c_str());
      }
    }
    std::printf("  files      %lld flat, %lld sharded\n", static_cast<long long>(report.layouts[0]),
                static_cast<long long>(report.layouts[1]));
    if (pack != nullptr) {
      std::printf("  packed     %lld samples in %lld shards (%lld compressed)\n",
                  static_cast<long long>(packed.samples), static_cast<long long>(packed.shards),
                  static_cast<long long>(packed.compressed));
      if (pack->manifest().budget_bytes > 0) {
        const nlohmann::json budget = budget_json(*pack, report);
        std::printf(
            "  budget     %.1f%% used (%.3f of %.3f GB): %lld rows kept, %lld not kept "
            "(an online run generates them every epoch)\n",
            100.0 * budget["share"].get<double>(), budget["used"].get<double>() / 1e9,
            budget["bytes"].get<double>() / 1e9, budget["kept_rows"].get<long long>(),
            budget["not_kept_rows"].get<long long>());
      }
      if (packed.fallbacks > 0) {
        std::printf(
            "  fallbacks  %lld packed rows read from their per-sample file instead (their "
            "packed sample fails):\n",
            static_cast<long long>(packed.fallbacks));
        for (const auto& example : packed.fallback_examples) {
          std::printf("      row %lld: %s\n", static_cast<long long>(example.row),
                      example.reason.c_str());
        }
      }
    }
    std::printf("scanned %s GB in %.3f s: %.2f GB/s on %u threads\n",
                gb_text(static_cast<double>(report.bytes)).c_str(), report.seconds, gb_per_s,
                report.threads);
  }
  return report.clean() ? 0 : 1;
}

const CommandRegistration kVerify({"verify", "check cached hidden states against the dataset",
                                   kUsage + command_flags().help() + kExit, run_verify});

}  // namespace

}  // namespace draftfeed::cli
