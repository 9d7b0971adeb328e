// `draftfeed pack DATA (--out DIR | --in-place)`: a per-sample hidden-state cache into a packed
// one (pack/pack_writer.h), with a progress bar and the bytes before and after.
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
#include "draftfeed/pack/pack_writer.h"
#include "flag_table.h"
#include "rewrite_progress.h"
#include "row_range.h"
#include "skip_report.h"
#include "stats_json.h"

namespace draftfeed::cli {
namespace {

const std::string kUsage = std::string(
    R"(usage: draftfeed pack DATA (--out DIR | --in-place) [options]

Packs DATA's hidden-state cache (DIR/hs_<row>.safetensors, default DATA/hidden_states) into shard
files of many samples each (shard-NNNNNN.safetensors, each a safetensors file whose tensors are
named <row>/<part>) and a manifest.json naming each sample's shard, byte range and checksum
(docs/formats.md, "Packed caches"). draftfeed reads a packed cache like the per-sample one: one
open per shard instead of one per sample per epoch. `draftfeed unpack` gives the per-sample files
back, byte for byte.

Each file is checked first, as `draftfeed verify` checks it; a file that fails (corrupt,
mismatched, non-finite, or locked by its writer) stays per-sample and is counted; readers still
find it there. Shards and the manifest are written to temporary files, fsynced and renamed; with
--in-place a per-sample file is removed only once the manifest naming it is on disk and its packed
sample reads back valid. A pack killed at any point leaves a cache that reads whole; running it
again goes on where it stopped. A row the pack holds whose per-sample file is there again (written
by `draftfeed generate` to repair a corrupt packed sample) is packed again from that file when
its packed sample does not read, and its file removed only when it does.

One rewrite of a folder at a time: pack holds the folder's writer lock (.draftfeed-writer.lock)
while it runs, on this host and, where the file system forwards locks, on others (docs/formats.md,
"The writer lock"). Loaders running meanwhile read the new pack from their next epoch.

)");

const FlagTable& command_flags() {
  static const FlagTable table =
      FlagTable{
          {"out", "DIR", "write the pack into DIR (created); the source cache is left as it is"},
          {"in-place", "", "pack into the cache folder and remove the per-sample files packed"},
          {"hidden-states", "DIR",
           "the source cache (default DATA/hidden_states; files in either layout)"},
          {"shard-bytes", "N",
           "per-sample bytes per shard (default " + std::to_string(kDefaultShardBytes) +
               "); one shard is held in memory while it is built"},
          {"compress", "",
           "code bf16 and FP8 hidden states losslessly (the exponent plane entropy-coded, "
           "planes-zstd): about 0.7x the bytes for bf16; decoded when read"},
          {"entropy", "CODER",
           "the exponent planes' coder of --compress: auto (default: huffman for bf16, zstd for "
           "FP8, each the faster there), huffman (format version 2) or zstd (version 1, which "
           "earlier draftfeed builds read)"},
          {"level", "L", "zstd level of --compress --entropy zstd (default 1)"},
          {"rows", "A:B", "only rows A..B-1 (either side may be left out)"},
      }
          .add(cache_rewrite_flags_table())
          .add({"json", "",
                "one JSON object: rows, packed, already_packed, "
                "repacked, missing, skipped (by kind), kept, shards, "
                "removed, bytes_before, bytes_after, ratio, hidden_ratio, "
                "seconds, lock_wait_seconds"});
  return table;
}

const std::string kExit = R"(
Exit status: 0 when every row with a valid file is packed, 1 when some stayed per-sample (or
another rewrite holds the folder), 2 for bad arguments.)";

int run_pack(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  const CacheRewriteFlags flags = cache_rewrite_flags(args, "pack", "a new packed cache");
  const std::int64_t shard_bytes =
      args.integer("shard-bytes", static_cast<std::int64_t>(kDefaultShardBytes));
  require(shard_bytes > 0 && shard_bytes <= (std::int64_t{1} << 40), ErrorKind::kInvalidArgument,
          "--shard-bytes must be between 1 and 2^40, got " + std::to_string(shard_bytes));
  const std::int64_t level = args.integer("level", 1);
  require(level >= -7 && level <= 19, ErrorKind::kInvalidArgument,
          "--level must be a zstd level between -7 and 19, got " + std::to_string(level));

  const auto dataset = TokenDataset::open(flags.data);
  const RowRange range = parse_row_range(args.str("rows", ""), dataset->num_rows());
  CacheStoreOptions store_options;
  store_options.root = flags.hidden;
  store_options.lock_mode = LockMode::kProbe;
  const CacheStore store(store_options);
  PackOptions options;
  options.rewrite = flags.options;
  options.shard_bytes = static_cast<std::uint64_t>(shard_bytes);
  options.compress = args.has("compress");
  options.codec.zstd_level = static_cast<int>(level);
  const std::string entropy = args.str("entropy", "auto");
  require(entropy == "auto" || entropy == "huffman" || entropy == "zstd",
          ErrorKind::kInvalidArgument,
          "--entropy must be auto, huffman or zstd, got '" + entropy + "'");
  options.codec.entropy = entropy == "zstd"      ? PlaneEntropy::kZstd
                          : entropy == "huffman" ? PlaneEntropy::kHuffman
                                                 : PlaneEntropy::kAuto;
  CacheRewriteProgress progress;
  PackReport report;
  run_with_progress("pack", range.end - range.begin, flags.progress_bar, progress, [&] {
    report = pack_cache(
        store, range.begin, range.end,
        [&dataset](std::int64_t row) { return RowIds(dataset->input_ids(row)); }, options,
        &progress);
  });
  if (flags.json) {
    nlohmann::json j;
    add_rewrite_json(j, report);
    j.update(stats_json(stats_tree(report)));
    j["hidden_ratio"] = byte_ratio(report.hidden_after, report.hidden_before);
    j["target"] = flags.in_place ? flags.hidden : flags.out;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("pack: %lld rows of %s -> %s\n", static_cast<long long>(report.rows),
                flags.hidden.c_str(), flags.in_place ? "(in place)" : flags.out.c_str());
    std::printf(
        "  packed %lld into %lld shards (%lld packed again), already packed %lld, "
        "missing %lld\n",
        static_cast<long long>(report.packed), static_cast<long long>(report.shards),
        static_cast<long long>(report.repacked), static_cast<long long>(report.already_packed),
        static_cast<long long>(report.missing));
    print_skipped("left per-sample", report.skipped, report.examples);
    char hidden[64];
    std::snprintf(hidden, sizeof hidden, "; hidden states %.1f%%",
                  100.0 * byte_ratio(report.hidden_after, report.hidden_before));
    print_rewrite_bytes(report, hidden);
  }
  return report.skipped_total() == 0 ? 0 : 1;
}

const CommandRegistration registration({"pack", "pack a hidden-state cache into shards",
                                        kUsage + command_flags().help() + kExit, run_pack});

}  // namespace
}  // namespace draftfeed::cli
