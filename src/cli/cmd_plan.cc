// `draftfeed plan DATA`: plan one epoch for every rank, as speculators' sampler would, and report
// how full the batches are, what was dropped and how evenly the ranks are loaded.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/common/error.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/sampler/multipack.h"
#include "draftfeed/sampler/plan_summary.h"
#include "flag_table.h"

namespace draftfeed::cli {

namespace {

const std::string kUsage = R"(usage: draftfeed plan DATA --world-size R --max-len N [options]

Plans one epoch of DATA (a `save_to_disk` folder) for all R data-parallel ranks with the multipack
planner (identical to speculators' MultipackDistributedBatchSamplerV2; lengths from the seq_len
column) and reports batches per rank, token fill per batch (percent of max_len), samples dropped and
the balance across ranks. Samples of equal length are ordered by the planner's own rule, not by
numpy's unstable argsort as in the reference and the Python API: batch counts, fills and every
batch's lengths are the reference's, but which of several equal-length samples a rank gets may
differ.

options:
)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"world-size", "R", "data-parallel ranks (required)"},
      {"max-len", "N", "tokens per rank's batch, the reference's total_seq_len (required)"},
      {"epoch", "E", "epoch to plan (default 0; the shuffle seed is seed + epoch)"},
      {"seed", "S", "planner seed, 0 to 2^64-1 (default 0)"},
      {"drop-long", "", "drop samples longer than max_len (default: clip their length)"},
      {"max-batches", "M", "keep only the first M batches per rank"},
      {"train-ratio", "F",
       "plan one part of the train/validation split (rows [0, int(n*F)) are train)"},
      {"split", "train|val", "which part with --train-ratio (default train)"},
      {"list", "", "also print every rank's batches as global row indices"},
      {"json", "",
       "one JSON object: data, rows, row_begin, row_end, split, world_size, max_len, epoch, seed, "
       "truncate, max_batches, batches_per_rank, samples {total, planned, long, dropped_long, "
       "dropped_tail, cut_by_max_batches}, planned_tokens, fill_percent {mean, min}, "
       "tokens_per_rank {max, min, ratio}, samples_per_rank {max, min, ratio}, plan_ms, and "
       "batches (with --list)"},
  };
  return table;
}

std::uint64_t parse_seed(const Args& args) {
  const std::string text = args.str("seed", "0");
  std::uint64_t seed = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seed);
  require(ec == std::errc() && end == text.data() + text.size(), ErrorKind::kInvalidArgument,
          "--seed wants an integer in [0, 2^64), got '" + text + "'");
  return seed;
}

nlohmann::ordered_json spread_json(const RankSpread& spread) {
  return {{"max", spread.max}, {"min", spread.min}, {"ratio", spread.ratio}};
}

void print_text(const nlohmann::ordered_json& r, const AllRanksPlan& plan,
                const DatasetSplit& split, bool list) {
  const auto& s = r["samples"];
  std::printf("data              %s: rows [%lld, %lld) (%s)\n",
              r["data"].get<std::string>().c_str(), static_cast<long long>(split.begin),
              static_cast<long long>(split.end), r["split"].get<std::string>().c_str());
  std::printf("plan              %d ranks x max_len %lld, epoch %lld, seed %llu, long samples %s\n",
              r["world_size"].get<int>(), r["max_len"].get<long long>(),
              r["epoch"].get<long long>(), r["seed"].get<unsigned long long>(),
              r["truncate"].get<bool>() ? "clipped" : "dropped");
  std::printf("batches per rank  %lld\n", r["batches_per_rank"].get<long long>());
  std::printf(
      "samples           %lld planned of %lld; %lld longer than max_len (%lld dropped), %lld "
      "dropped at the end, %lld cut by --max-batches\n",
      s["planned"].get<long long>(), s["total"].get<long long>(), s["long"].get<long long>(),
      s["dropped_long"].get<long long>(), s["dropped_tail"].get<long long>(),
      s["cut_by_max_batches"].get<long long>());
  std::printf("token fill        mean %.2f%%, min %.2f%% of max_len\n",
              r["fill_percent"]["mean"].get<double>(), r["fill_percent"]["min"].get<double>());
  for (const auto& [key, label] : {std::pair{"tokens_per_rank", "tokens per rank"},
                                   std::pair{"samples_per_rank", "samples per rank"}}) {
    const auto& spread = r[key];
    std::printf("%-17s max %lld, min %lld (max/min %.4f)\n", label, spread["max"].get<long long>(),
                spread["min"].get<long long>(), spread["ratio"].get<double>());
  }
  std::printf("planned in        %.1f ms\n", r["plan_ms"].get<double>());
  if (!list) return;
  for (std::size_t rank = 0; rank < plan.ranks.size(); ++rank) {
    for (std::int64_t b = 0; b < plan.ranks[rank].num_batches(); ++b) {
      std::printf("rank %zu batch %lld:", rank, static_cast<long long>(b));
      for (const auto sample : plan.ranks[rank].batch(b)) {
        std::printf(" %lld", static_cast<long long>(split.global_row(sample)));
      }
      std::printf("\n");
    }
  }
}

int run_plan(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, 1, "one dataset folder");
  require(args.has("world-size") && args.has("max-len"), ErrorKind::kInvalidArgument,
          "--world-size and --max-len are required (see --help)");
  const std::int64_t world_size = args.integer("world-size", 1);
  require(world_size >= 1 && world_size <= (1 << 20), ErrorKind::kInvalidArgument,
          "--world-size must be in [1, 2^20], got " + std::to_string(world_size));
  PlanOptions options;
  options.world_size = static_cast<int>(world_size);
  options.max_len = args.integer("max-len", 8192, 1);
  options.seed = parse_seed(args);
  options.truncate = !args.has("drop-long");
  options.max_batches = args.opt_integer("max-batches", 0);
  const std::int64_t epoch = args.integer("epoch", 0, 0);
  const std::string split_name = args.str("split", "train");
  require(split_name == "train" || split_name == "val", ErrorKind::kInvalidArgument,
          "--split must be train or val, got '" + split_name + "'");
  require(!args.has("split") || args.has("train-ratio"), ErrorKind::kInvalidArgument,
          "--split needs --train-ratio");

  const auto dataset = TokenDataset::open(args.positionals()[0]);
  DatasetSplit split{dataset, 0, dataset->num_rows()};
  std::string split_label = "all rows";
  if (args.has("train-ratio")) {
    const auto parts = split_train_val(dataset, args.fraction("train-ratio", 0.9));
    split = split_name == "train" ? parts.first : parts.second;
    split_label = split_name + " split";
  }

  const auto started = std::chrono::steady_clock::now();
  const AllRanksPlan plan = plan_all_ranks(split.seq_lens(), options, epoch);
  const double plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  const PlanSummary summary = summarize_plan(plan, split.seq_lens(), options.max_len);

  nlohmann::ordered_json report{
      {"data", dataset->folder()},
      {"rows", split.num_rows()},
      {"row_begin", split.begin},
      {"row_end", split.end},
      {"split", split_label},
      {"world_size", options.world_size},
      {"max_len", options.max_len},
      {"epoch", epoch},
      {"seed", options.seed},
      {"truncate", options.truncate},
      {"max_batches", options.max_batches ? nlohmann::ordered_json(*options.max_batches)
                                          : nlohmann::ordered_json()},
      {"batches_per_rank", summary.batches_per_rank},
      {"samples",
       {{"total", plan.counts.num_samples},
        {"planned", plan.counts.planned},
        {"long", plan.counts.num_long},
        {"dropped_long", plan.counts.dropped_long},
        {"dropped_tail", plan.counts.dropped_tail},
        {"cut_by_max_batches", plan.counts.cut_by_max_batches}}},
      {"planned_tokens", summary.planned_tokens},
      {"fill_percent", {{"mean", summary.fill_mean_percent}, {"min", summary.fill_min_percent}}},
      {"tokens_per_rank", spread_json(summary.tokens_per_rank)},
      {"samples_per_rank", spread_json(summary.samples_per_rank)},
      {"plan_ms", plan_ms}};
  const bool list = args.has("list");
  if (args.has("json")) {
    if (list) {
      auto& batches = report["batches"] = nlohmann::ordered_json::array();
      for (const RankPlan& rank : plan.ranks) {
        auto rank_batches = nlohmann::ordered_json::array();
        for (std::int64_t b = 0; b < rank.num_batches(); ++b) {
          auto rows = nlohmann::ordered_json::array();
          for (const auto sample : rank.batch(b)) rows.push_back(split.global_row(sample));
          rank_batches.push_back(std::move(rows));
        }
        batches.push_back(std::move(rank_batches));
      }
    }
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    print_text(report, plan, split, list);
  }
  return 0;
}

const CommandRegistration kRegistration(
    {"plan", "plan an epoch's batches for every rank and report balance",
     kUsage + command_flags().help(), run_plan});

}  // namespace

}  // namespace draftfeed::cli
