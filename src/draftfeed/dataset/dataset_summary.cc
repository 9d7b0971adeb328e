#include "draftfeed/dataset/dataset_summary.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace draftfeed {

DatasetSummary summarize(const TokenDataset& dataset, int bins) {
  DatasetSummary s;
  s.folder = dataset.folder();
  s.rows = dataset.num_rows();
  s.shard_paths = dataset.shard_paths();
  s.columns = dataset.columns();
  s.tokens = dataset.total_tokens();
  const auto lens = dataset.seq_lens();
  if (lens.empty()) return s;
  const auto [lo, hi] = std::minmax_element(lens.begin(), lens.end());
  s.seq_len_min = *lo;
  s.seq_len_max = *hi;
  long double sum = 0;
  for (const auto len : lens) sum += static_cast<long double>(len);
  s.seq_len_mean = static_cast<double>(sum / static_cast<long double>(lens.size()));

  bins = std::max(1, bins);
  const auto range = static_cast<double>(s.seq_len_max - s.seq_len_min);
  const double width = range > 0 ? range / bins : 1.0;
  for (int b = 0; b <= bins; ++b)
    s.bin_edges.push_back(static_cast<double>(s.seq_len_min) + width * b);
  s.bin_counts.assign(static_cast<std::size_t>(bins), 0);
  for (const auto len : lens) {
    auto bin = static_cast<std::int64_t>(static_cast<double>(len - s.seq_len_min) / width);
    bin = std::clamp<std::int64_t>(bin, 0, bins - 1);
    ++s.bin_counts[static_cast<std::size_t>(bin)];
  }
  return s;
}

nlohmann::ordered_json summary_json(const DatasetSummary& s) {
  nlohmann::ordered_json columns = nlohmann::ordered_json::object();
  for (const auto& column : s.columns) columns[column.name] = column.type;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const auto& path : s.shard_paths) {
    files.push_back(std::filesystem::path(path).filename().string());
  }
  const bool empty = s.rows == 0;
  nlohmann::ordered_json seq_len{
      {"min", empty ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.seq_len_min)},
      {"mean", empty ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.seq_len_mean)},
      {"max", empty ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.seq_len_max)}};
  return {{"folder", s.folder},
          {"rows", s.rows},
          {"shards", s.shard_paths.size()},
          {"shard_files", files},
          {"columns", columns},
          {"tokens", s.tokens},
          {"seq_len", seq_len},
          {"histogram", {{"edges", s.bin_edges}, {"counts", s.bin_counts}}}};
}

std::string summary_text(const DatasetSummary& s) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "dataset  %s\nrows     %lld in %zu shard(s)\ntokens   %lld\n",
                s.folder.c_str(), static_cast<long long>(s.rows), s.shard_paths.size(),
                static_cast<long long>(s.tokens));
  out += line;
  out += "columns\n";
  for (const auto& column : s.columns) out += "  " + column.name + ": " + column.type + "\n";
  if (s.rows == 0) return out + "seq_len  (no rows)\n";
  std::snprintf(line, sizeof(line), "seq_len  min %lld  mean %.2f  max %lld\n",
                static_cast<long long>(s.seq_len_min), s.seq_len_mean,
                static_cast<long long>(s.seq_len_max));
  out += line;
  const std::int64_t peak = *std::max_element(s.bin_counts.begin(), s.bin_counts.end());
  constexpr int kBarWidth = 40;
  for (std::size_t b = 0; b < s.bin_counts.size(); ++b) {
    const int bar = peak > 0 ? static_cast<int>(s.bin_counts[b] * kBarWidth / peak) : 0;
    std::snprintf(line, sizeof(line), "  [%9.1f, %9.1f%c %9lld  %s\n", s.bin_edges[b],
                  s.bin_edges[b + 1], b + 1 == s.bin_counts.size() ? ']' : ')',
                  static_cast<long long>(s.bin_counts[b]), std::string(bar, '#').c_str());
    out += line;
  }
  return out;
}

}  // namespace draftfeed
