#include "loader_run.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_geometry.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/loader/loader.h"
#include "draftfeed/pipeline/host_memory.h"
#include "draftfeed/source/online_source.h"
#include "stream_report.h"

namespace draftfeed::cli {

namespace {

DType batch_dtype(const std::string& text) {
  if (text == "bfloat16" || text == "bf16") return DType::kBF16;
  if (text == "float32" || text == "fp32" || text == "f32") return DType::kF32;
  throw Error(ErrorKind::kInvalidArgument, "--dtype must be bf16 or fp32, got '" + text + "'");
}

Preprocess preprocess_of(const std::string& text) {
  if (text == "none") return Preprocess::kNone;
  if (text == "eagle3" || text == "peagle") return Preprocess::kEagle3Shift;
  if (text == "mtp") return Preprocess::kMtp;
  throw Error(ErrorKind::kInvalidArgument,
              "--preprocess must be none, eagle3 or mtp, got '" + text + "'");
}

}  // namespace

int run_loader(const LoaderRunConfig& config) {
  const auto dataset = TokenDataset::open(config.data);
  const auto [train, val] = split_train_val(dataset, config.train_ratio);
  const std::string hs_path =
      config.hidden_states.empty() ? config.data + "/hidden_states" : config.hidden_states;

  std::int64_t hidden = config.hidden_size.value_or(0);
  std::int64_t layers = config.layers.value_or(0);
  const bool online = !config.endpoints.empty();
  if (online) {
    require(hidden > 0 && layers > 0, ErrorKind::kInvalidArgument,
            "online runs need --hidden-size and --layers (the cache may be empty)");
  }
  if (hidden == 0 || layers == 0) {
    const auto geometry = probe_cache_geometry(hs_path, train);
    require(geometry.has_value(), ErrorKind::kNotFound,
            hs_path +
                ": no readable hidden-state file among the first training rows; pass "
                "--hidden-size and --layers, or fill the cache first");
    if (hidden == 0) hidden = geometry->hidden;
    if (layers == 0) layers = geometry->layers;
  }

  LoaderOptions options;
  options.data_path = config.data;
  options.hidden_states_path = hs_path;
  options.split = "train";
  options.train_ratio = config.train_ratio;
  options.rank = config.rank;
  options.batch.max_len = config.max_len;
  options.batch.hidden_size = hidden;
  options.batch.num_target_layers = layers - 1;
  options.batch.dtype = batch_dtype(config.dtype);
  options.batch.preprocess = preprocess_of(config.preprocess);
  options.batch.noise = NoiseSpec{NoiseKind::kUniform, config.noise_std, config.seed};
  options.plan.world_size = config.world_size;
  options.plan.max_batches = config.max_batches;
  options.on_missing = config.on_missing;
  std::shared_ptr<OnlineSampleSource> online_source;
  if (online) {
    OnlineSourceOptions online_options;
    online_options.hidden_states_path = hs_path;
    online_options.dataset = dataset;  // multimodal rows: the chat request
    online_options.server_dir = config.server_dir;
    online_options.on_generate = parse_on_generate(config.on_generate);
    online_options.client.endpoints = config.endpoints;
    online_options.client.model = config.model;
    online_options.client.concurrency = config.concurrency;
    online_options.client.request_timeout = std::chrono::duration<double>(config.request_timeout);
    online_source = std::make_shared<OnlineSampleSource>(online_options);
    options.source = online_source;
  }
  options.pipeline.num_threads = config.threads;  // the online source's fetches get their own
  options.pipeline.prefetch = config.prefetch;
  options.pipeline.in_order = config.in_order;
  Loader train_loader(options, dataset);
  Loader val_loader(options.validation(), dataset);

  if (!config.json) {
    std::printf("data      %s: %lld rows (train %lld, val %lld)\n", config.data.c_str(),
                static_cast<long long>(dataset->num_rows()),
                static_cast<long long>(train.num_rows()), static_cast<long long>(val.num_rows()));
    std::printf("hidden    %s: L=%lld layers, H=%lld, batches in %s\n", hs_path.c_str(),
                static_cast<long long>(layers), static_cast<long long>(hidden),
                torch_dtype_name(options.batch.dtype));
    std::printf("engine    %d threads, %d buffers of %s (peak batch memory %s), %s, %s (%s)\n",
                config.threads, config.prefetch,
                human_bytes(static_cast<double>(train_loader.layout().total_bytes)).c_str(),
                human_bytes(static_cast<double>(train_loader.pool_bytes())).c_str(),
                config.in_order ? "in order" : "as ready",
                train_loader.metrics().pinned ? "pinned memory" : "pageable memory",
                train_loader.pinning_detail().c_str());
    std::fflush(stdout);
  }

  nlohmann::json report;
  report["passes"] = nlohmann::json::array();
  for (int epoch = 0; epoch < config.epochs; ++epoch) {
    StreamSummary s =
        stream_pass(train_loader, "train " + std::to_string(epoch), epoch, config.progress);
    if (!config.json) print_summary(s);
    report["passes"].push_back(nlohmann::json::parse(summary_json(s)));
    if (config.validation) {
      // As the reference trainer: a validation pass after each epoch, its sampler set to the epoch.
      StreamSummary v =
          stream_pass(val_loader, "val " + std::to_string(epoch), epoch, config.progress);
      if (!config.json) print_summary(v);
      report["passes"].push_back(nlohmann::json::parse(summary_json(v)));
    }
  }
  if (online_source) {
    const OnlineSourceStats online_stats = online_source->stats();
    report["online"] = {{"generated", online_stats.generated},
                        {"exhausted", online_stats.exhausted},
                        {"requests", online_stats.client.requests},
                        {"max_in_flight", online_stats.client.max_in_flight}};
    if (!config.json) {
      std::printf("online    %lld generated, %lld failed, %lld requests, max %lld in flight\n",
                  static_cast<long long>(online_stats.generated),
                  static_cast<long long>(online_stats.exhausted),
                  static_cast<long long>(online_stats.client.requests),
                  static_cast<long long>(online_stats.client.max_in_flight));
    }
  }
  report["peak_rss_bytes"] = peak_rss_bytes();
  report["pool_bytes"] = train_loader.pool_bytes() + val_loader.pool_bytes();
  if (config.json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf(
        "peak memory %s resident (batch pools %s)\n",
        human_bytes(static_cast<double>(peak_rss_bytes())).c_str(),
        human_bytes(static_cast<double>(train_loader.pool_bytes() + val_loader.pool_bytes()))
            .c_str());
  }
  return 0;
}

}  // namespace draftfeed::cli
