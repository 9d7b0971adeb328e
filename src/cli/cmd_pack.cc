// `draftfeed pack DATA (--out DIR | --in-place)`: a per-sample hidden-state cache into a packed
// one (pack/pack_writer.h), with a progress bar and the bytes before and after.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "args.h"
#include "cache_rewrite_flags.h"
#include "command.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/pack/pack_writer.h"
#include "pack_progress.h"
#include "row_range.h"
#include "skip_report.h"

namespace draftfeed::cli {
namespace {

constexpr const char* kUsage =
    R"(usage: draftfeed pack DATA (--out DIR | --in-place) [--hidden-states DIR] [--shard-bytes N]
                     [--compress] [--level L] [--threads N] [--rows A:B] [--examples K]
                     [--no-progress] [--json]

Packs DATA's hidden-state cache (DIR/hs_<row>.safetensors, default DATA/hidden_states) into shard
files of many samples each (shard-NNNNNN.safetensors, each a safetensors file whose tensors are
named <row>/<part>) and a manifest.json naming each sample's shard, byte range and checksum
(docs/formats.md, "Packed caches"). draftfeed reads a packed cache like the per-sample one: one
open per shard instead of one per sample per epoch. `draftfeed unpack` gives the per-sample files
back, byte for byte.

Each file is checked first, as `draftfeed verify` checks it; a file that fails (corrupt,
mismatched, non-finite, or locked by its writer) stays per-sample and is counted; readers still
find it there. Shards and the manifest are written to temporary files, fsynced and renamed; with
--in-place a per-sample file is removed only once the manifest naming it is on disk. A pack killed
at any point leaves a cache that reads whole; running it again goes on where it stopped.

  --out DIR            write the pack into DIR (created); the source cache is left as it is
  --in-place           pack into the cache folder and remove the per-sample files packed
  --hidden-states DIR  the source cache (default DATA/hidden_states; files in either layout)
  --shard-bytes N      per-sample bytes per shard (default 1073741824); one shard is held in
                       memory while it is built
  --compress           code bf16 and FP8 hidden states losslessly (exponent plane through zstd,
                       planes-zstd): about 0.7x the bytes for bf16; decoded when read
  --level L            zstd level of --compress (default 1)
  --threads N          encoding threads (default: one per core)
  --rows A:B           only rows A..B-1 (either side may be left out)
  --examples K         problems listed per kind (default 5)
  --no-progress        no progress bar
  --json               one JSON object: rows, packed, already_packed, missing, skipped (by kind),
                       shards, removed, bytes_before, bytes_after, ratio, hidden_ratio, seconds

Exit status: 0 when every row with a valid file is packed, 1 when some stayed per-sample, 2 for
bad arguments.)";

int run_pack(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"out", "hidden-states", "threads", "rows", "examples", "shard-bytes", "level"},
                  {"in-place", "compress", "no-progress", "json"});
  const CacheRewriteFlags flags = cache_rewrite_flags(args, "pack", "a new packed cache");
  const std::string& data = flags.data;
  const std::string& hidden = flags.hidden;
  const std::string& out = flags.out;
  const bool in_place = flags.in_place;
  const std::int64_t threads = flags.threads;
  const std::int64_t shard_bytes =
      args.integer("shard-bytes", static_cast<std::int64_t>(kDefaultShardBytes));
  require(shard_bytes > 0 && shard_bytes <= (std::int64_t{1} << 40), ErrorKind::kInvalidArgument,
          "--shard-bytes must be between 1 and 2^40, got " + std::to_string(shard_bytes));
  const std::int64_t level = args.integer("level", 1);
  require(level >= -7 && level <= 19, ErrorKind::kInvalidArgument,
          "--level must be a zstd level between -7 and 19, got " + std::to_string(level));
  const std::int64_t examples = args.integer("examples", 5);
  require(examples >= 0, ErrorKind::kInvalidArgument,
          "--examples must be >= 0, got " + std::to_string(examples));
  const bool json = flags.json;
  const bool show = flags.progress_bar;

  const auto dataset = TokenDataset::open(data);
  const RowRange range = parse_row_range(args.str("rows", ""), dataset->num_rows());
  CacheStoreOptions store_options;
  store_options.root = hidden;
  store_options.lock_mode = LockMode::kProbe;
  const CacheStore store(store_options);
  PackOptions options;
  options.target_root = out;
  options.shard_bytes = static_cast<std::uint64_t>(shard_bytes);
  options.compress = args.has("compress");
  options.codec.zstd_level = static_cast<int>(level);
  options.threads = static_cast<unsigned>(threads);
  options.max_examples = static_cast<std::size_t>(examples);
  PackProgress progress;
  PackReport report;
  run_with_progress("pack", range.end - range.begin, show, progress, [&] {
    report = pack_cache(
        store, range.begin, range.end,
        [&dataset](std::int64_t row) { return RowIds(dataset->input_ids(row)); }, options,
        &progress);
  });
  const auto ratio = [](std::uint64_t after, std::uint64_t before) {
    return before > 0 ? static_cast<double>(after) / static_cast<double>(before) : 0.0;
  };
  if (json) {
    nlohmann::json j;
    j["rows"] = report.rows;
    j["packed"] = report.packed;
    j["already_packed"] = report.already_packed;
    j["missing"] = report.missing;
    j["shards"] = report.shards;
    j["manifest_writes"] = report.manifest_writes;
    j["removed"] = report.removed;
    add_skipped_json(j, report.skipped, report.examples);
    j["bytes_before"] = report.bytes_before;
    j["bytes_after"] = report.bytes_after;
    j["ratio"] = ratio(report.bytes_after, report.bytes_before);
    j["hidden_before"] = report.hidden_before;
    j["hidden_after"] = report.hidden_after;
    j["hidden_ratio"] = ratio(report.hidden_after, report.hidden_before);
    j["seconds"] = report.seconds;
    j["threads"] = report.threads;
    j["target"] = in_place ? hidden : out;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("pack: %lld rows of %s -> %s\n", static_cast<long long>(report.rows),
                hidden.c_str(), in_place ? "(in place)" : out.c_str());
    std::printf("  packed %lld into %lld shards, already packed %lld, missing %lld\n",
                static_cast<long long>(report.packed), static_cast<long long>(report.shards),
                static_cast<long long>(report.already_packed),
                static_cast<long long>(report.missing));
    print_skipped("left per-sample", report.skipped, report.examples);
    std::printf("bytes: %s -> %s (%.1f%%; hidden states %.1f%%) in %.2f s on %u threads\n",
                gigabytes(static_cast<double>(report.bytes_before)).c_str(),
                gigabytes(static_cast<double>(report.bytes_after)).c_str(),
                100.0 * ratio(report.bytes_after, report.bytes_before),
                100.0 * ratio(report.hidden_after, report.hidden_before), report.seconds,
                report.threads);
  }
  return report.skipped_total() == 0 ? 0 : 1;
}

const CommandRegistration registration({"pack", "pack a hidden-state cache into shards", kUsage,
                                        run_pack});

}  // namespace
}  // namespace draftfeed::cli
