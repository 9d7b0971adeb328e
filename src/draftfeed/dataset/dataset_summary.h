// What `draftfeed inspect` reports about a token dataset, as a value, JSON and text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {

struct DatasetSummary {
  std::string folder;
  std::int64_t rows = 0;
  std::vector<std::string> shard_paths;
  std::vector<ColumnInfo> columns;
  std::int64_t tokens = 0;  // sum of input_ids list lengths
  // Over seq_lens() (the seq_len column when present); zero when there are no rows.
  std::int64_t seq_len_min = 0;
  std::int64_t seq_len_max = 0;
  double seq_len_mean = 0.0;
  // Histogram of seq_lens(): `bins` equal-width bins over [min, max]; bin_edges has bins + 1
  // values.
  std::vector<double> bin_edges;
  std::vector<std::int64_t> bin_counts;
};

DatasetSummary summarize(const TokenDataset& dataset, int bins = 10);

// {"folder", "rows", "shards" (count), "shard_files", "columns" {name: type}, "tokens",
//  "seq_len" {"min", "mean", "max"} (null values when empty), "histogram" {"edges", "counts"}}.
nlohmann::ordered_json summary_json(const DatasetSummary& summary);

// Human-readable report with a text bar histogram.
std::string summary_text(const DatasetSummary& summary);

}  // namespace draftfeed
