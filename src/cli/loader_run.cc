#include "loader_run.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_geometry.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/loader/loader.h"
#include "draftfeed/loader/online_sources.h"
#include "draftfeed/pipeline/host_memory.h"
#include "draftfeed/read_ahead/byte_budget.h"
#include "stats_json.h"
#include "stream_report.h"

namespace draftfeed::cli {

int run_loader(LoaderOptions options, std::optional<OnlineSourceOptions> online,
               const LoaderRun& run) {
  const auto dataset = TokenDataset::open(options.data_path);
  const auto [train, val] = split_train_val(dataset, options.train_ratio);
  std::string& hs_path = options.cache.hidden_states_path;
  if (hs_path.empty()) hs_path = default_hidden_states_path(options.data_path);

  std::int64_t hidden = run.hidden_size.value_or(0);
  std::int64_t layers = run.layers.value_or(0);
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
  options.split = Split::kTrain;
  options.batch.hidden_size = hidden;
  options.batch.num_target_layers = layers - 1;
  OnlineSources sources;
  if (online) {
    online->cache.hidden_states_path = hs_path;
    online->dataset = dataset;  // multimodal rows (the chat request), the lookahead's token ids
    sources = make_online_sources(*online, run.lookahead);
    options.source = sources.engine_source();  // its fetches get threads of their own
  }
  Loader train_loader(options, dataset);
  Loader val_loader(options.validation(), dataset);

  if (!run.json) {
    std::printf("data      %s: %lld rows (train %lld, val %lld)\n", options.data_path.c_str(),
                static_cast<long long>(dataset->num_rows()),
                static_cast<long long>(train.num_rows()), static_cast<long long>(val.num_rows()));
    std::printf("hidden    %s: L=%lld layers, H=%lld, batches in %s\n", hs_path.c_str(),
                static_cast<long long>(layers), static_cast<long long>(hidden),
                torch_dtype_name(options.batch.dtype));
    std::printf("engine    %d threads, %d buffers of %s (peak batch memory %s), %s, %s (%s)\n",
                options.pipeline.num_threads, options.pipeline.buffers,
                human_bytes(static_cast<double>(train_loader.layout().total_bytes)).c_str(),
                human_bytes(static_cast<double>(train_loader.pool_bytes())).c_str(),
                options.pipeline.in_order ? "in order" : "as ready",
                train_loader.metrics().pinned ? "pinned memory" : "pageable memory",
                train_loader.pinning_detail().c_str());
    std::fflush(stdout);
  }

  nlohmann::json report;
  report["passes"] = nlohmann::json::array();
  for (int epoch = 0; epoch < run.epochs; ++epoch) {
    StreamSummary s =
        stream_pass(train_loader, "train " + std::to_string(epoch), epoch, run.progress);
    if (!run.json) print_summary(s);
    report["passes"].push_back(nlohmann::json::parse(summary_json(s)));
    if (run.validation) {
      // As the reference trainer: a validation pass after each epoch, its sampler set to the epoch.
      StreamSummary v =
          stream_pass(val_loader, "val " + std::to_string(epoch), epoch, run.progress);
      if (!run.json) print_summary(v);
      report["passes"].push_back(nlohmann::json::parse(summary_json(v)));
    }
  }
  if (sources.online) {
    const OnlineSourceStats online_stats = sources.online->stats();
    // The source's groups ("online", and "lookahead" when on), as the Python stats name them.
    for (const StatsTree::Group& group : sources.engine_source()->stats_report().groups) {
      report[group.name] = stats_json(group.tree);
    }
    if (!run.json) {
      std::printf("online    %lld generated, %lld failed, %lld requests, max %lld in flight\n",
                  static_cast<long long>(online_stats.generated),
                  static_cast<long long>(online_stats.exhausted),
                  static_cast<long long>(online_stats.client.requests),
                  static_cast<long long>(online_stats.client.max_in_flight));
    }
  }
  // What the read-ahead held ahead of the buffers: the train loader's source, and the validation
  // loader's when it has its own (an online source is shared).
  ReadAheadMemory ahead = train_loader.metrics().read_ahead_memory;
  if (val_loader.options().source != train_loader.options().source) {
    ahead += val_loader.metrics().read_ahead_memory;
  }
  report["read_ahead_memory"] = stats_json(stats_tree(ahead));
  if (!run.json) {
    std::printf("read-ahead held %s at most, within %s; %lld hedge(s): %lld won, %lld lost\n",
                human_bytes(static_cast<double>(ahead.peak_bytes)).c_str(),
                human_bytes(static_cast<double>(ahead.limit_bytes)).c_str(),
                static_cast<long long>(ahead.hedges), static_cast<long long>(ahead.hedges_won),
                static_cast<long long>(ahead.hedges_lost));
  }
  report["peak_rss_bytes"] = peak_rss_bytes();
  report["pool_bytes"] = train_loader.pool_bytes() + val_loader.pool_bytes();
  if (run.json) {
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
