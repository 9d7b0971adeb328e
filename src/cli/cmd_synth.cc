// `draftfeed synth OUT --rows N ...`: writes a deterministic synthetic token dataset
// (see draftfeed/dataset/synthetic.h for the functions of seed, row and position).
//
// Structure: `synth_dataset` parses the dataset flags and writes the dataset, returning the options
// it used; further parts (a hidden-state cache keyed by the same seed and rows) plug in after it
// in `run_synth`, with their flags added to the sets there.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/common/error.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "flag_table.h"

namespace draftfeed::cli {

namespace {

const std::string kUsage =
    R"(usage: draftfeed synth OUT --rows N [options] [--hidden-size H [cache options]]

Writes a synthetic token dataset to the folder OUT in the layout of datasets' save_to_disk
(Arrow stream shards, state.json with torch format, dataset_info.json). Row r's length, token ids
and loss mask are deterministic functions of (S, r, position), documented in
src/draftfeed/dataset/synthetic.h.

)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"rows", "N", "rows to write (required)"},
      {"seed", "S", "seed (default 0)"},
      {"min-len", "A", "shortest row (default 32)"},
      {"max-len", "B", "longest row (default 512)"},
      {"vocab", "V", "token ids are in [0, V) (default 32000)"},
      {"shards", "K", "exactly K shards (default: by size, 500 MB each)"},
      {"int32", "", "store input_ids as list<int32> (default list<int64>)"},
      {"json", "",
       "print a JSON summary: folder, rows, tokens, shards, bytes, seed, min_len, max_len, vocab "
       "(and hidden_states when written)"},
      {"hidden-size", "H", "hidden size of the cache",
       "With --hidden-size, also writes a hidden-state cache for every row: "
       "DIR/hs_<row>.safetensors\n(default DIR: OUT/hidden_states) holding the row's token_ids "
       "and hidden_states [T, L, H] whose\nvalues are functions of (S, row, position, layer, h), "
       "documented in\nsrc/draftfeed/hidden/synthetic_cache.h.\n"},
      {"layers", "L", "captured layers (default 4)"},
      {"dtype", "bf16|f16|f32", "the cache's dtype (default bf16)"},
      {"hidden-states", "DIR", "where to write the cache"},
  };
  return table;
}

// The hidden-state part of `synth` (with --hidden-size): a cache for the dataset just written.
struct SynthHidden {
  std::string folder;
  SyntheticHiddenStateSpec spec;
  SyntheticCacheStats written;
};

std::optional<SynthHidden> synth_hidden_states(const Args& args, const std::string& out,
                                               std::uint64_t seed) {
  if (!args.has("hidden-size")) {
    require(!args.has("layers") && !args.has("dtype") && !args.has("hidden-states"),
            ErrorKind::kInvalidArgument,
            "--layers, --dtype and --hidden-states need --hidden-size H");
    return std::nullopt;
  }
  SynthHidden hidden;
  hidden.folder = args.str("hidden-states", default_hidden_states_path(out));
  hidden.spec.seed = seed;
  hidden.spec.hidden_size = args.integer("hidden-size", 0);
  hidden.spec.layers = args.integer("layers", 4);
  const std::string dtype = args.str("dtype", "bf16");
  require(dtype == "bf16" || dtype == "f16" || dtype == "f32", ErrorKind::kInvalidArgument,
          "--dtype must be bf16, f16 or f32, got '" + dtype + "'");
  hidden.spec.dtype = dtype == "bf16" ? DType::kBF16 : dtype == "f16" ? DType::kF16 : DType::kF32;
  const auto dataset = TokenDataset::open(out);
  hidden.written = write_synthetic_hidden_states(
      hidden.folder, dataset->num_rows(),
      [&dataset](std::int64_t row, std::vector<std::int64_t>& ids) {
        const IntArrayView view = dataset->input_ids(row);
        ids.resize(static_cast<std::size_t>(view.size()));
        if (!view.guarded_copy_to(ids.data())) throw unreadable_row(view, row, "input_ids");
      },
      hidden.spec);
  return hidden;
}

// The dataset part of `synth`: what it was asked for and what it wrote.
struct SynthDataset {
  SyntheticOptions options;
  DatasetWriteSummary written;
};

SynthDataset synth_dataset(const Args& args, const std::string& out) {
  const auto rows = args.opt_integer("rows", 0);
  require(rows.has_value(), ErrorKind::kInvalidArgument, "--rows N is required");
  SynthDataset synth;
  synth.options.rows = *rows;
  synth.options.seed = static_cast<std::uint64_t>(args.integer("seed", 0, 0));
  synth.options.min_len = args.integer("min-len", synth.options.min_len, 0);
  synth.options.max_len = args.integer("max-len", synth.options.max_len);
  require(synth.options.min_len <= synth.options.max_len, ErrorKind::kInvalidArgument,
          "--min-len " + std::to_string(synth.options.min_len) + " is above --max-len " +
              std::to_string(synth.options.max_len));
  synth.options.vocab = args.integer("vocab", synth.options.vocab, 1);
  validate(synth.options);
  DatasetWriterOptions writer;
  writer.input_ids_int32 = args.has("int32");
  writer.num_shards = args.integer("shards", 0);
  require(writer.num_shards >= 0, ErrorKind::kInvalidArgument,
          "--shards must be >= 0, got " + std::to_string(writer.num_shards));
  synth.written = write_synthetic_dataset(out, synth.options, writer);
  return synth;
}

int run_synth(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, 1, "one output folder");
  const std::string out = args.positionals()[0];
  const SynthDataset synth = synth_dataset(args, out);
  const auto hidden = synth_hidden_states(args, out, synth.options.seed);
  const auto& w = synth.written;
  if (args.has("json")) {
    nlohmann::ordered_json report{{"folder", out},
                                  {"rows", w.rows},
                                  {"tokens", w.tokens},
                                  {"shards", w.shard_paths.size()},
                                  {"bytes", w.bytes},
                                  {"seed", synth.options.seed},
                                  {"min_len", synth.options.min_len},
                                  {"max_len", synth.options.max_len},
                                  {"vocab", synth.options.vocab}};
    if (hidden) {
      report["hidden_states"] = {
          {"folder", hidden->folder},       {"files", hidden->written.files},
          {"bytes", hidden->written.bytes}, {"hidden_size", hidden->spec.hidden_size},
          {"layers", hidden->spec.layers},  {"dtype", std::string(dtype_name(hidden->spec.dtype))}};
    }
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("wrote %lld rows (%lld tokens, %.1f MB) in %zu shard(s) to %s\n",
                static_cast<long long>(w.rows), static_cast<long long>(w.tokens),
                static_cast<double>(w.bytes) / 1e6, w.shard_paths.size(), out.c_str());
    if (hidden) {
      std::printf("wrote %lld hidden-state files (%.1f MB) to %s\n",
                  static_cast<long long>(hidden->written.files),
                  static_cast<double>(hidden->written.bytes) / 1e6, hidden->folder.c_str());
    }
  }
  return 0;
}

const CommandRegistration kRegistration({"synth", "write a deterministic synthetic dataset",
                                         kUsage + command_flags().help(), run_synth});

}  // namespace

}  // namespace draftfeed::cli
