// `draftfeed bench DATA`: stream the user's data through the engine as a trainer would and report.
#include "args.h"
#include "command.h"
#include "loader_run.h"

namespace draftfeed::cli {
namespace {

const char* kUsage = R"(usage: draftfeed bench DATA [options]

Streams training epochs and a validation pass of DATA (a `save_to_disk` folder) and its hidden-state
cache through the engine, with a progress bar, and reports tokens/s, GB/s of hidden states, time to
first batch, consumer wait and peak memory.

options:
  --hidden-states DIR   cache folder (default DATA/hidden_states)
  --max-len N           tokens per batch, the reference's total_seq_len (default 8192)
  --hidden-size H       verifier hidden size (default: read from the cache)
  --layers L            captured layers per token (default: read from the cache)
  --dtype bf16|fp32     batch dtype of the hidden states (default bf16)
  --preprocess NAME     none | eagle3 | mtp (default none)
  --noise-std S         uniform training noise (default 0.05; 0 turns it off)
  --seed S              planner and noise seed (default 0)
  --train-ratio F       train/validation split (default 0.9)
  --world-size R --rank r   plan as data-parallel rank r of R (default 1, 0)
  --threads N           fetch + assembly threads (default 2)
  --prefetch P          batch buffers (default 4)
  --as-ready            deliver batches as they are ready instead of in order
  --on-missing POLICY   skip | warn | raise for rows without a cached file (default skip)
  --max-batches N       stop each training epoch after N batches
  --epochs E            training epochs (default 1)
  --no-val              skip the validation pass
  --no-progress         no progress bar
  --json                print the report as JSON)";

int run(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"hidden-states", "max-len", "hidden-size", "layers", "dtype", "preprocess",
                   "noise-std", "seed", "train-ratio", "world-size", "rank", "threads", "prefetch",
                   "on-missing", "max-batches", "epochs"},
                  {"as-ready", "no-val", "no-progress", "json"});
  args.expect_positionals(1, 1, "DATA");
  LoaderRunConfig config;
  config.data = args.positionals()[0];
  config.hidden_states = args.str("hidden-states", "");
  config.max_len = args.integer("max-len", 8192);
  config.hidden_size = args.opt_integer("hidden-size");
  config.layers = args.opt_integer("layers");
  config.dtype = args.str("dtype", "bf16");
  config.preprocess = args.str("preprocess", "none");
  config.noise_std = args.real("noise-std", 0.05);
  config.seed = static_cast<std::uint64_t>(args.integer("seed", 0));
  config.train_ratio = args.real("train-ratio", 0.9);
  config.world_size = static_cast<int>(args.integer("world-size", 1));
  config.rank = static_cast<int>(args.integer("rank", 0));
  config.threads = static_cast<int>(args.integer("threads", 2));
  config.prefetch = static_cast<int>(args.integer("prefetch", 4));
  config.in_order = !args.has("as-ready");
  config.on_missing = args.str("on-missing", "skip");
  config.max_batches = args.opt_integer("max-batches");
  config.epochs = static_cast<int>(args.integer("epochs", 1));
  config.validation = !args.has("no-val");
  config.json = args.has("json");
  config.progress = !args.has("no-progress") && !config.json;
  return run_loader(config);
}

const CommandRegistration registration({"bench",
                                        "stream DATA through the engine and report throughput",
                                        kUsage, run});

}  // namespace
}  // namespace draftfeed::cli
