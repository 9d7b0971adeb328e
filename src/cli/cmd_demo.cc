// `draftfeed demo [--out DIR] [--rows N]`: writes a small synthetic dataset and shows what
// `inspect` sees in it. A starting point for a walkthrough of the whole data path.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/dataset/dataset_summary.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed::cli {

namespace {

constexpr const char* kUsage = R"(usage: draftfeed demo [--out DIR] [--rows N] [--seed S]

Writes a synthetic token dataset (default 4000 rows into a new folder under /tmp) and prints what
`draftfeed inspect` reports about it.)";

std::string make_temp_folder() {
  std::string pattern = "/tmp/draftfeed-demo-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(ErrorKind::kIo, "cannot create a temporary folder under /tmp");
  }
  return pattern;
}

int run_demo(const std::vector<std::string>& argv) {
  const Args args(argv, {"out", "rows", "seed"}, {});
  args.expect_positionals(0, 0, "no positional arguments");
  SyntheticOptions options;
  options.rows = args.integer("rows", 4000);
  options.seed = static_cast<std::uint64_t>(args.integer("seed", 0));
  validate(options);
  const std::string out = args.has("out") ? args.str("out", "") : make_temp_folder();
  const auto written = write_synthetic_dataset(out, options);
  std::printf("wrote a synthetic dataset of %lld rows to %s\n\n",
              static_cast<long long>(written.rows), out.c_str());
  std::printf("$ draftfeed inspect %s\n%s", out.c_str(),
              summary_text(summarize(*TokenDataset::open(out))).c_str());
  return 0;
}

const CommandRegistration kRegistration({"demo", "write a small synthetic dataset and inspect it",
                                         kUsage, run_demo});

}  // namespace

}  // namespace draftfeed::cli
