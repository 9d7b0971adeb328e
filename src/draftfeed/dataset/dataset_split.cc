// split_train_val (docs/sampler.md): the boundary is Python's `int(n_rows * train_ratio)`.
#include <cmath>
#include <sstream>

#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {

std::pair<DatasetSplit, DatasetSplit> split_train_val(std::shared_ptr<const TokenDataset> dataset,
                                                      double train_ratio) {
  const std::int64_t n = dataset->num_rows();
  std::ostringstream ratio_text;
  ratio_text << train_ratio;
  if (!(train_ratio > 0.0 && train_ratio < 1.0)) {
    throw Error(ErrorKind::kInvalidArgument,
                "train_ratio must be in (0, 1) for a train/val split, "
                "got " +
                    ratio_text.str());
  }
  // int() truncates toward zero; the product is a double in Python too, so the rounding matches.
  const auto split = static_cast<std::int64_t>(static_cast<double>(n) * train_ratio);
  if (split <= 0 || split >= n) {
    throw Error(ErrorKind::kInvalidArgument,
                dataset->folder() + ": " + std::to_string(n) + " rows with train_ratio " +
                    ratio_text.str() + " give split index " + std::to_string(split) + ", so the " +
                    (split <= 0 ? "train" : "val") + " split is empty");
  }
  DatasetSplit train{dataset, 0, split};
  DatasetSplit val{std::move(dataset), split, n};
  return {std::move(train), std::move(val)};
}

}  // namespace draftfeed
