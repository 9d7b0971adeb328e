// `draftfeed generate DATA --endpoint URL ...`: fills the hidden-state cache from vLLM servers for
// every row that lacks a valid file or packed sample. Resumable: rows whose file or packed sample
// is valid are skipped, so running it again finishes what a crash or a failing server left.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/common/folder_lock.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/validate.h"
#include "draftfeed/pack/live_packed_cache.h"
#include "draftfeed/source/online_source.h"
#include "online_flags.h"
#include "row_range.h"
#include "stats_json.h"

namespace draftfeed::cli {
namespace {

const FlagTable& command_flags() {
  static const FlagTable table =
      FlagTable{{"hidden-states", "DIR", "cache folder (default DATA/hidden_states)"}}
          .add(online_flags())
          .add(FlagTable{
              {"rows", "A:B", "only rows A..B-1 (either side may be left out)"},
              {"fp8", "",
               "store each generated file as hs-connectors' FP8 file (float8_e4m3fn + per-token "
               "scales, about half the bytes; files already valid are kept as they are: see "
               "quantize)"},
              {"pack", "",
               "keep the generated rows in the folder's pack (shards and a manifest, "
               "docs/formats.md) instead of a file per row: no per-sample file is written; a "
               "shard is committed under the folder's writer lock, waiting --lock-wait for it "
               "(default 60 s here), as other ranks and runs may write there too"},
              {"compress", "", "with --pack: hidden states coded losslessly (planes-zstd)"},
              {"layout", "flat|sharded",
               "where new files go: DIR/hs_<row>.safetensors (flat, the default) or DIR/<row // "
               "1000, 4 digits>/hs_<row>.safetensors (sharded, draftfeed's layout for large "
               "caches); files already there are found in either layout"},
              {"lock-wait", "S",
               "a folder holding a pack is rewritten under its writer lock (docs/formats.md): "
               "wait up to S seconds for another rewrite's (pack, unpack, quantize) to end "
               "(default 0: refuse at once, naming its host and pid)"},
              {"no-progress", "", "no progress bar"},
              {"json", "", "print the summary as JSON"},
          });
  return table;
}

std::string usage() {
  return R"(usage: draftfeed generate DATA --endpoint URL [--endpoint URL2 ...] [options]

Fills DATA's hidden-state cache (DIR/hs_<row>.safetensors, or sharded: --layout) from vLLM servers running the
hidden-states connector, for every row without a valid file or a valid sample in the folder's pack
(manifest.json: `draftfeed pack`; a missing, corrupt, mismatched or non-finite file is regenerated). Rows are requested concurrently from the least busy endpoint; a
failing endpoint is rested and tried again later. Multimodal rows (a `messages` column whose turns
have list content) are sent as chat requests with their messages, others as token ids. Each generated
file is checked (token ids, shape, finite values) and moved into the cache atomically.

options:
)" + command_flags().help() +
         R"(
Exit status: 0 when every row of the range has a valid file, 1 when some remain unfilled,
2 for bad arguments.)";
}

// True when the row's sample is in the cache folder's pack (its checksum checked) or in its
// per-sample file, and passes every check: a packed row is not asked of a server again.
bool has_valid_file(const CacheStore& store, const PackedCache* pack, const TokenDataset& dataset,
                    std::int64_t row) {
  const RowIds ids(dataset.input_ids(row));
  if (const PackEntry* entry = pack != nullptr ? pack->find(row) : nullptr) {
    auto packed = pack->read(*entry, /*always_check=*/true);
    if (packed.ok() && validate_sample(packed.value().sample, ids, row).ok()) return true;
  }
  auto found = store.lookup(row);
  if (!found.ok() || !found.value()) return false;
  return validate_sample(*found.value(), ids, row).ok();
}

// The same, in the pack as it is now: a pack that another process wrote since this one started
// (into a folder without a pack, which generate does not lock) is looked at before a row is
// generated again.
bool has_valid_file(const CacheStore& store, LivePackedCache& live, const TokenDataset& dataset,
                    std::int64_t row) {
  const std::shared_ptr<const PackedCache> pack = live.current();
  if (has_valid_file(store, pack.get(), dataset, row)) return true;
  auto now = live.refresh();
  return now.ok() && now.value() != pack && has_valid_file(store, now.value().get(), dataset, row);
}

struct Progress {
  std::atomic<std::int64_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::atomic<std::int64_t> existing{0};
  std::atomic<std::int64_t> generated{0};
  std::atomic<std::int64_t> failed{0};
  std::atomic<std::int64_t> uncached{
      0};  // generated, but the cache refused the file (disk full...)
  std::atomic<std::int64_t> tokens{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::string fatal;
};

void draw(const Progress& p, std::int64_t total, double seconds, std::int64_t in_flight) {
  constexpr int kWidth = 30;
  const std::int64_t done = p.done.load();
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const double rate = seconds > 0 ? 1.0 / seconds : 0.0;
  std::fprintf(stderr,
               "\rgenerate [%s] %lld/%lld rows  %7.1f rows/s  %9.0f tok/s  in flight %lld  "
               "failed %lld  ",
               bar.c_str(), static_cast<long long>(done), static_cast<long long>(total),
               static_cast<double>(p.generated.load()) * rate,
               static_cast<double>(p.tokens.load()) * rate, static_cast<long long>(in_flight),
               static_cast<long long>(p.failed.load()));
  std::fflush(stderr);
}

int run_generate(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, 1, "one dataset folder");
  const std::string data = args.positionals()[0];
  require(args.has("endpoint"), ErrorKind::kInvalidArgument,
          "generate needs at least one --endpoint URL");

  OnlineSourceOptions options = online_options_from(args);
  options.cache.hidden_states_path = args.str("hidden-states", default_hidden_states_path(data));
  const bool keep_packed = args.has("pack");
  require(!args.has("compress") || keep_packed, ErrorKind::kInvalidArgument,
          "--compress is for --pack (a pack's shards)");
  require(!(keep_packed && args.has("fp8")), ErrorKind::kInvalidArgument,
          "--fp8 writes per-sample FP8 files; --pack keeps the generated files losslessly "
          "(draftfeed quantize converts per-sample files)");
  require(!args.has("cache-budget") || keep_packed, ErrorKind::kInvalidArgument,
          "--cache-budget is for --pack");
  options.on_generate = keep_packed ? OnGenerate::kPack : OnGenerate::kCache;
  options.cache_compress = args.has("compress");
  options.cache_fp8 = args.has("fp8");
  options.cache_layout = args.parsed("layout", "flat", parse_cache_layout);
  const bool json = args.has("json");
  const bool progress = !args.has("no-progress") && !json && ::isatty(STDERR_FILENO);
  const double lock_wait = args.real("lock-wait", keep_packed ? 60.0 : 0.0, 0.0);
  options.cache_lock_wait = std::chrono::duration<double>(lock_wait);

  const auto dataset = TokenDataset::open(data);
  const RowRange range = parse_row_range(args.str("rows", ""), dataset->num_rows());
  const std::int64_t total = range.end - range.begin;
  options.dataset = dataset;  // multimodal rows: the chat request with their messages
  OnlineSampleSource source(options);
  // A pack in the cache folder (`draftfeed pack`) holds rows too; a bad manifest is refused here
  // as by every reader. Writing into a folder that holds a pack is a rewrite of it: its writer
  // lock is held for the whole run (a pack or unpack meanwhile could otherwise remove the file of
  // a row generated to repair it), and the pack read again once the lock is ours.
  // With --pack, the source's appender takes the lock for each shard's commit instead.
  std::optional<FolderLock> lock;
  if (!keep_packed && pack_manifest_stamp(options.cache.hidden_states_path).exists) {
    auto locked = FolderLock::acquire(options.cache.hidden_states_path, "draftfeed generate",
                                      std::chrono::duration<double>(lock_wait));
    if (!locked.ok()) {
      const Error& error = locked.error();
      throw Error(
          error.kind(),
          std::string(error.what()) +
              (error.kind() == ErrorKind::kTimeout ? " (--lock-wait SECONDS waits for it)" : ""));
    }
    lock.emplace(std::move(locked).value());
  }
  LivePackedCache pack(options.cache.hidden_states_path);
  // Copies into the cache that a killed run left half-written (never read as samples) go first.
  const std::int64_t stale_temporaries = source.store()->remove_stale_temporaries();

  Progress p;
  p.next = range.begin;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    while (!p.stop.load()) {
      const std::int64_t row = p.next.fetch_add(1);
      if (row >= range.end) return;
      if (has_valid_file(*source.store(), pack, *dataset, row)) {
        ++p.existing;
        ++p.done;
        continue;
      }
      const IntArrayView ids = dataset->input_ids(row);
      const FetchOutcome outcome = source.generate_row(row, ids);
      if (outcome.sample && !keep_packed && !has_valid_file(*source.store(), pack, *dataset, row)) {
        // Generated and valid, but moving it into the cache failed (said on stderr as it
        // happened, naming the file): the row is not filled.
        ++p.uncached;
        ++p.failed;
      } else if (outcome.sample) {
        ++p.generated;
        p.tokens += ids.size();
      } else {
        ++p.failed;
        if (outcome.fatal) {
          std::lock_guard lock(p.mutex);
          if (p.fatal.empty()) p.fatal = outcome.message;
          p.stop = true;
          source.cancel();
        }
      }
      ++p.done;
    }
  };
  std::vector<std::thread> threads;
  const std::int64_t n_threads =
      std::min<std::int64_t>(options.client.fetch_threads, std::max<std::int64_t>(total, 1));
  for (std::int64_t t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  if (progress) {
    while (p.done.load() < total && !p.stop.load()) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      draw(p, total, seconds, source.stats().client.in_flight);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  for (auto& t : threads) t.join();
  // With --pack, the last shard committed (waited for) before the rows are counted.
  source.flush_kept();
  const std::optional<PackAppendStats> kept = source.kept_stats();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) {
    draw(p, total, seconds, 0);
    std::fprintf(stderr, "\n");
  }

  const OnlineSourceStats stats = source.stats();
  // Kept in the pack (--pack): generated rows count as filled once a manifest names them.
  const std::int64_t generated_and_kept =
      kept ? std::min<std::int64_t>(p.generated.load(), kept->kept) : p.generated.load();
  const std::int64_t filled = p.existing.load() + generated_and_kept;
  const std::int64_t unfilled = total - filled;
  nlohmann::json report;
  report["rows"] = total;
  report["existing"] = p.existing.load();
  report["generated"] = p.generated.load();
  report["failed"] = p.failed.load();
  report["uncached"] = p.uncached.load();
  report["unfilled"] = unfilled;
  if (kept) report["kept"] = stats_json(stats_tree(*kept));
  report["stale_temporaries_removed"] = stale_temporaries;
  report["seconds"] = seconds;
  report["rows_per_s"] = seconds > 0 ? static_cast<double>(p.generated.load()) / seconds : 0.0;
  report["tokens_per_s"] = seconds > 0 ? static_cast<double>(p.tokens.load()) / seconds : 0.0;
  report["chat_rows"] = stats.chat_rows;
  report["bad_messages"] = stats.bad_messages;
  report["requests"] = stats.client.requests;
  report["retries"] = stats.client.retries;
  report["max_in_flight"] = stats.client.max_in_flight;
  report["connections_opened"] = stats.client.connections_opened;
  nlohmann::json reasons = nlohmann::json::object();
  for (std::size_t f = 1; f < stats.failures.request.size(); ++f) {
    if (stats.failures.request[f] > 0) {
      reasons[generation_failure_name(static_cast<GenerationResult::Failure>(f))] =
          stats.failures.request[f];
    }
  }
  for (std::size_t f = 1; f < stats.failures.file.size(); ++f) {
    if (stats.failures.file[f] > 0) {
      reasons[file_problem_name(static_cast<FileProblem>(f))] = stats.failures.file[f];
    }
  }
  report["failed_round_trips"] = reasons;
  nlohmann::json problems = nlohmann::json::object();
  for (std::size_t k = 1; k < stats.client.problems.size(); ++k) {
    if (stats.client.problems[k] > 0) {
      problems[response_problem_name(static_cast<ResponseProblem>(k))] = stats.client.problems[k];
    }
  }
  report["invalid_responses"] = problems;
  report["transport_errors"] = stats.client.transport_errors;
  report["timeouts"] = stats.client.timeouts;
  report["too_large"] = stats.client.too_large;
  report["http_retryable"] = stats.client.http_retryable;
  report["http_other"] = stats.client.http_other;
  report["fatal"] = p.fatal;
  nlohmann::json per_endpoint = nlohmann::json::array();
  for (const auto& e : stats.client.endpoints) {
    per_endpoint.push_back(
        {{"url", e.url}, {"requests", e.requests}, {"failures", e.failures}, {"rests", e.rests}});
  }
  report["endpoints"] = per_endpoint;

  if (json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("rows      %lld (%lld already valid, %lld generated, %lld failed, %lld unfilled)\n",
                static_cast<long long>(total), static_cast<long long>(p.existing.load()),
                static_cast<long long>(p.generated.load()), static_cast<long long>(p.failed.load()),
                static_cast<long long>(unfilled));
    std::printf("speed     %.1f s, %.1f rows/s, %.0f tokens/s, %lld requests, max %lld in flight\n",
                seconds, report["rows_per_s"].get<double>(), report["tokens_per_s"].get<double>(),
                static_cast<long long>(stats.client.requests),
                static_cast<long long>(stats.client.max_in_flight));
    if (kept) {
      std::printf(
          "kept      %lld rows in the pack's %lld new shards (%s; the pack %.3f GB%s)\n",
          static_cast<long long>(kept->kept), static_cast<long long>(kept->shards),
          kept->full ? "the budget is reached" : "within the budget",
          static_cast<double>(kept->pack_bytes) / 1e9,
          kept->budget_bytes > 0
              ? (" of " + std::to_string(static_cast<double>(kept->budget_bytes) / 1e9) + " GB")
                    .c_str()
              : "");
    }
    if (p.uncached.load() > 0) {
      std::printf("uncached  %lld rows generated but not moved into the cache (see the warnings)\n",
                  static_cast<long long>(p.uncached.load()));
    }
    if (!reasons.empty()) std::printf("failures  %s\n", reasons.dump().c_str());
    if (!problems.empty()) std::printf("invalid   %s\n", problems.dump().c_str());
    if (!p.fatal.empty()) std::printf("stopped   %s\n", p.fatal.c_str());
  }
  return unfilled == 0 ? 0 : 1;
}

const CommandRegistration registration({"generate", "fill the hidden-state cache from vLLM servers",
                                        usage(), run_generate});

}  // namespace
}  // namespace draftfeed::cli
