// `draftfeed demo`: the README's first command. Synthesises a dataset and its hidden-state cache
// (a few hundred MB), streams a training epoch and a validation pass through the engine with a
// progress bar, and ends with the throughput summary.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/dataset/dataset_summary.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "loader_run.h"
#include "stream_report.h"

namespace draftfeed::cli {

namespace {

constexpr const char* kUsage = R"(usage: draftfeed demo [options]

Writes a synthetic token dataset and a matching hidden-state cache (bf16, a few hundred MB by
default) into a temporary folder, then streams training epochs and a validation pass through the
engine as a trainer would receive them, with a progress bar and a throughput summary. The folder is
removed at the end unless --out or --keep is given.

options:
  --out DIR           write the data here (kept)
  --keep              keep the temporary folder
  --rows N            dataset rows (default 96)
  --min-len A         shortest row (default 64)
  --max-len B         longest row (default 1024)
  --hidden-size H     verifier hidden size (default 1024)
  --layers L          captured layers (default 4)
  --total-seq-len N   tokens per batch (default 4096)
  --threads N         engine threads (default: cores)
  --epochs E          training epochs streamed (default 3)
  --seed S            seed of the data, the planner and the noise (default 0))";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string make_temp_folder() {
  std::string pattern = (std::filesystem::temp_directory_path() / "draftfeed-demo-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(ErrorKind::kIo, "cannot create a temporary folder for the demo");
  }
  return pattern;
}

int run_demo(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"out", "rows", "min-len", "max-len", "hidden-size", "layers", "total-seq-len",
                   "threads", "seed", "epochs"},
                  {"keep"});
  args.expect_positionals(0, 0, "no positional arguments");
  SyntheticOptions options;
  options.rows = args.integer("rows", 96);
  options.min_len = args.integer("min-len", 64);
  options.max_len = args.integer("max-len", 1024);
  options.seed = static_cast<std::uint64_t>(args.integer("seed", 0));
  validate(options);
  const bool keep = args.has("out") || args.has("keep");
  const std::string out = args.has("out") ? args.str("out", "") : make_temp_folder();

  auto start = std::chrono::steady_clock::now();
  const auto written = write_synthetic_dataset(out, options);
  std::printf("1. dataset   %lld rows, %lld tokens -> %s (%.2f s)\n",
              static_cast<long long>(written.rows), static_cast<long long>(written.tokens),
              out.c_str(), seconds_since(start));

  SyntheticHiddenStateSpec spec;
  spec.seed = options.seed;
  spec.hidden_size = args.integer("hidden-size", 1024);
  spec.layers = args.integer("layers", 4);
  start = std::chrono::steady_clock::now();
  const auto cache = write_synthetic_hidden_states(
      out + "/hidden_states", options.rows,
      [&](std::int64_t row, std::vector<std::int64_t>& ids) {
        std::vector<std::int64_t> mask;
        synthetic_row(options, row, &ids, &mask);
      },
      spec);
  std::printf("2. cache     %lld hidden-state files, %s of bf16 [T, %lld, %lld] (%.2f s)\n",
              static_cast<long long>(cache.files),
              human_bytes(static_cast<double>(cache.bytes)).c_str(),
              static_cast<long long>(spec.layers), static_cast<long long>(spec.hidden_size),
              seconds_since(start));
  std::printf("3. inspect\n%s\n", summary_text(summarize(*TokenDataset::open(out))).c_str());
  std::printf("4. stream    training epochs and a validation pass, as the trainer gets them\n");
  std::fflush(stdout);

  LoaderRunConfig config;
  config.data = out;
  config.max_len = args.integer("total-seq-len", 4096);
  config.hidden_size = spec.hidden_size;
  config.layers = spec.layers;
  config.seed = options.seed;
  config.epochs = static_cast<int>(args.integer("epochs", 3));
  config.threads =
      static_cast<int>(args.integer("threads", std::max(2L, ::sysconf(_SC_NPROCESSORS_ONLN))));
  const int status = run_loader(config);

  if (!keep) {
    std::error_code ignored;
    std::filesystem::remove_all(out, ignored);
    std::printf("(removed %s; pass --keep or --out DIR to keep the data)\n", out.c_str());
  }
  return status;
}

const CommandRegistration kRegistration({"demo",
                                         "synthesise data and stream an epoch through the engine",
                                         kUsage, run_demo});

}  // namespace
}  // namespace draftfeed::cli
