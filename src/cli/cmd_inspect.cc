// `draftfeed inspect DATA [--json]`: what the dataset reader sees in a `save_to_disk` folder.
#include <cstdio>
#include <string>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/dataset/dataset_summary.h"
#include "draftfeed/dataset/token_dataset.h"
#include "flag_table.h"

namespace draftfeed::cli {

namespace {

const std::string kUsage = R"(usage: draftfeed inspect DATA [options]

Opens DATA (a folder written by datasets' Dataset.save_to_disk, or by `draftfeed synth`) and
reports its rows, shards, columns with their Arrow types, total tokens (sum of input_ids lengths),
seq_len min/mean/max (the seq_len column when present, else input_ids lengths) and a histogram.

)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"json", "",
       "one JSON object: folder, rows, shards (count), shard_files, columns {name: type}, tokens, "
       "seq_len {min, mean, max}, histogram {edges, counts}"},
      {"bins", "N", "histogram bins (default 10)"},
  };
  return table;
}

int run_inspect(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(1, 1, "one dataset folder");
  const std::int64_t bins = args.integer("bins", 10);
  require(bins >= 1 && bins <= 1000, ErrorKind::kInvalidArgument,
          "--bins must be between 1 and 1000, got " + std::to_string(bins));
  const auto dataset = TokenDataset::open(args.positionals()[0]);
  const DatasetSummary summary = summarize(*dataset, static_cast<int>(bins));
  if (args.has("json")) {
    std::printf("%s\n", summary_json(summary).dump(2).c_str());
  } else {
    std::printf("%s", summary_text(summary).c_str());
  }
  return 0;
}

const CommandRegistration kRegistration({"inspect",
                                         "show a token dataset's rows, columns, tokens and lengths",
                                         kUsage + command_flags().help(), run_inspect});

}  // namespace

}  // namespace draftfeed::cli
