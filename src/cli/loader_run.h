// A training run without a trainer: plan each epoch, stream the training split and a validation
// pass through the pipeline, and report. `draftfeed bench` runs it on the user's data, `draftfeed
// demo` on a synthetic dataset.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace draftfeed::cli {

struct LoaderRunConfig {
  std::string data;
  std::string hidden_states;  // default <data>/hidden_states
  std::int64_t max_len = 8192;
  std::optional<std::int64_t> hidden_size;  // default: read from the cache
  std::optional<std::int64_t> layers;       // L, default: read from the cache
  std::string dtype = "bfloat16";
  std::string preprocess = "none";
  double noise_std = 0.05;
  std::uint64_t seed = 0;
  double train_ratio = 0.9;
  int world_size = 1;
  int rank = 0;
  int threads = 2;
  int prefetch = 4;
  bool in_order = true;
  std::string on_missing = "skip";
  std::optional<std::int64_t> max_batches;
  int epochs = 1;
  bool validation = true;
  bool progress = true;
  bool json = false;
};

// Returns the exit status.
int run_loader(const LoaderRunConfig& config);

}  // namespace draftfeed::cli
