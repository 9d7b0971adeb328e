#include "draftfeed/loader/loader.h"

#include <utility>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/pipeline/epoch_plan.h"
#include "draftfeed/source/cache_source.h"

namespace draftfeed {

namespace {

DatasetSplit select_split(const std::shared_ptr<const TokenDataset>& dataset,
                          const LoaderOptions& options) {
  if (options.split == "all") return DatasetSplit{dataset, 0, dataset->num_rows()};
  require(options.split == "train" || options.split == "val", ErrorKind::kInvalidArgument,
          "split must be 'train', 'val' or 'all', got '" + options.split + "'");
  auto [train, val] = split_train_val(dataset, options.train_ratio);
  return options.split == "train" ? train : val;
}

std::shared_ptr<SampleSource> cache_source(const LoaderOptions& options) {
  CacheStoreOptions store;
  store.root = options.hidden_states_path;
  store.lock_timeout = std::chrono::duration<double>(options.lock_timeout);
  return std::make_shared<CacheSampleSource>(std::make_shared<const CacheStore>(store),
                                             parse_on_missing(options.on_missing),
                                             parse_fp8_dequantize(options.fp8_dequantize));
}

LoaderOptions completed(LoaderOptions options) {
  if (options.hidden_states_path.empty()) {
    options.hidden_states_path = options.data_path + "/hidden_states";
  }
  require(options.rank >= 0 && options.rank < options.plan.world_size, ErrorKind::kInvalidArgument,
          "rank " + std::to_string(options.rank) + " is outside world_size " +
              std::to_string(options.plan.world_size));
  options.plan.max_len = options.batch.max_len;
  options.plan.seed = options.batch.noise.seed;
  // Noise belongs to the training split alone.
  options.pipeline.noise = options.split == "train" &&
                           options.batch.noise.kind != NoiseKind::kNone &&
                           options.batch.noise.std > 0.0;
  if (options.pipeline.device_stage) {
    require(options.batch.preprocess != Preprocess::kCustom, ErrorKind::kInvalidArgument,
            "the device stage needs the engine to pack its batches: a preprocess callable runs in "
            "Python on host memory (turn the device stage off)");
    require(options.pipeline.device_buffers >= 1, ErrorKind::kInvalidArgument,
            "device_buffers must be at least 1, got " +
                std::to_string(options.pipeline.device_buffers));
    options.pipeline.try_pin = true;  // copies from pageable memory would not run asynchronously
  }
  if (!options.source) options.source = cache_source(options);
  return options;
}

}  // namespace

LoaderOptions LoaderOptions::validation() const {
  LoaderOptions val = *this;
  val.split = "val";
  val.plan.max_batches.reset();
  val.batch.noise.seed = 0;
  return val;
}

Loader::Loader(LoaderOptions options, std::shared_ptr<const TokenDataset> dataset)
    : options_(completed(std::move(options))) {
  if (!dataset) dataset = TokenDataset::open(options_.data_path);
  split_ = select_split(dataset, options_);
  pipeline_ = std::make_unique<Pipeline>(make_batch_layout(options_.batch), split_.dataset,
                                         options_.source, options_.pipeline);
  if (options_.pipeline.device_stage) {
    const int device = resolve_cuda_device(options_.pipeline.cuda_device);
    require(pipeline_->cuda_worker() != nullptr, ErrorKind::kInvalidArgument,
            "the device stage needs CUDA device cuda:" + std::to_string(device) + ": " +
                pipeline_->pinning_detail());
    device_stage_ =
        std::make_unique<DeviceStage>(std::make_shared<const BatchLayout>(pipeline_->layout()),
                                      pipeline_->cuda_worker(), options_.pipeline.device_buffers);
  }
}

Loader::~Loader() {
  stop();
  device_stage_.reset();
  // Page-locked and device memory are freed by the device worker once the device has read them:
  // wait for that here, so a loader that is gone leaves none behind (unless a batch outlives it).
  const std::shared_ptr<DeviceWorker> worker = pipeline_->cuda_worker();
  pipeline_.reset();
  if (worker) worker->settle();
}

std::shared_ptr<BatchLease> Loader::next(CudaStream consumer) {
  return device_stage_ ? device_stage_->next(consumer) : pipeline_->next(consumer);
}

void Loader::stop() {
  if (device_stage_) device_stage_->begin_stop();
  pipeline_->stop();
  if (device_stage_) device_stage_->join();
}

PipelineMetrics Loader::metrics() const {
  PipelineMetrics metrics = pipeline_->metrics();
  if (device_stage_) device_stage_->fill_metrics(metrics);
  if (const auto* cache = dynamic_cast<const CacheSampleSource*>(options_.source.get())) {
    metrics.prefetch = cache->prefetch_stats();
  }
  return metrics;
}

const RankPlan& Loader::plan(std::int64_t epoch, const WindowOrder& window_order) {
  auto found = plans_.find(epoch);
  if (found != plans_.end() && !window_order) return found->second;
  PlanOptions plan = options_.plan;
  plan.window_order = window_order;
  RankPlan planned = plan_rank(split_.seq_lens(), plan, options_.rank, epoch);
  if (plans_.size() >= 4) plans_.erase(plans_.begin());
  return plans_[epoch] = std::move(planned);
}

void Loader::start(std::int64_t epoch, std::vector<PlannedBatch> batches) {
  require(epoch >= 0, ErrorKind::kInvalidArgument,
          "epoch must be non-negative, got " + std::to_string(epoch));
  for (const PlannedBatch& batch : batches) {
    for (const std::int64_t row : batch.rows) {
      require(row >= 0 && row < split_.dataset->num_rows(), ErrorKind::kInvalidArgument,
              "batch " + std::to_string(batch.index) + " names row " + std::to_string(row) +
                  ", outside the dataset's " + std::to_string(split_.dataset->num_rows()) +
                  " rows");
    }
  }
  stop();
  pipeline_->start(static_cast<std::uint64_t>(epoch), std::move(batches));
  if (device_stage_) {
    device_stage_->start([pipeline = pipeline_.get()](CudaStream copy_stream) {
      return pipeline->next(copy_stream);
    });
  }
}

void Loader::start_epoch(std::int64_t epoch) { start(epoch, planned_batches(plan(epoch), split_)); }

}  // namespace draftfeed
