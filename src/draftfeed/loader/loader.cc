#include "draftfeed/loader/loader.h"

#include <array>
#include <utility>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/error.h"
#include "draftfeed/pipeline/epoch_plan.h"
#include "draftfeed/source/cache_source.h"

namespace draftfeed {

namespace {

constexpr std::array<EnumName<Split>, 3> kSplitNames = {{
    {Split::kTrain, "train"},
    {Split::kVal, "val"},
    {Split::kAll, "all"},
}};

DatasetSplit select_split(const std::shared_ptr<const TokenDataset>& dataset,
                          const LoaderOptions& options) {
  if (options.split == Split::kAll) return DatasetSplit{dataset, 0, dataset->num_rows()};
  auto [train, val] = split_train_val(dataset, options.train_ratio);
  return options.split == Split::kTrain ? train : val;
}

LoaderOptions completed(LoaderOptions options) {
  if (options.cache.hidden_states_path.empty()) {
    options.cache.hidden_states_path = options.data_path + "/hidden_states";
  }
  options.plan.max_len = options.batch.max_len;
  options.plan.seed = options.batch.noise.seed;
  // Noise belongs to the training split alone (the one place this rule is made): the other
  // splits' batches have none, and their options say so.
  if (options.split != Split::kTrain) {
    options.batch.noise.kind = NoiseKind::kNone;
    options.batch.noise.std = 0.0;
  }
  options.pipeline.noise = options.batch.noise.enabled();
  // Copies from pageable memory would not run asynchronously.
  if (options.pipeline.device_stage) options.pipeline.try_pin = true;
  options.validate();
  if (!options.source) options.source = std::make_shared<CacheSampleSource>(options.cache);
  return options;
}

}  // namespace

Split parse_split(std::string_view text) { return parse_enum(text, kSplitNames, "split"); }

const char* split_name(Split split) { return enum_name(split, kSplitNames); }

void LoaderOptions::validate() const {
  require(
      rank >= 0 && rank < plan.world_size, ErrorKind::kInvalidArgument,
      "rank " + std::to_string(rank) + " is outside world_size " + std::to_string(plan.world_size));
  require(!pipeline.device_stage || batch.preprocess != Preprocess::kCustom,
          ErrorKind::kInvalidArgument,
          "the device stage needs the engine to pack its batches: a preprocess callable runs in "
          "Python on host memory (turn the device stage off)");
  batch.validate();
  // The planner's bound, named as the loader's option (its own message says max_len).
  require(batch.max_len < kMaxPlanLength, ErrorKind::kInvalidArgument,
          "total_seq_len must be below 2^40, got " + std::to_string(batch.max_len));
  plan.validate();
  pipeline.validate();
  if (!source) cache.validate();
}

LoaderOptions LoaderOptions::validation() const {
  LoaderOptions val = *this;
  val.split = Split::kVal;
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

void Loader::set_device_allocator(std::shared_ptr<DeviceAllocator> allocator) {
  require(device_stage_ != nullptr, ErrorKind::kInvalidArgument,
          "device memory is for the device stage, which this loader does not have");
  stop();
  device_stage_->set_allocator(std::move(allocator));
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
