#include "draftfeed/loader/loader.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <utility>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/read_ahead/byte_budget.h"
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

// Each loader's plan is its own stream in a shared source's read-ahead.
std::atomic<int> next_read_ahead_stream{0};

// The batches at `positions` of `local` (split-local indices) as global rows.
std::vector<PlannedBatch> global_batches(const std::vector<std::vector<std::int64_t>>& local,
                                         const std::vector<std::int64_t>& positions,
                                         const DatasetSplit& split) {
  std::vector<PlannedBatch> out(positions.size());
  for (std::size_t b = 0; b < positions.size(); ++b) {
    const std::vector<std::int64_t>& samples = local[static_cast<std::size_t>(positions[b])];
    out[b].index = positions[b];
    out[b].rows.reserve(samples.size());
    for (const std::int64_t sample : samples) {
      require(sample >= 0 && sample < split.num_rows(), ErrorKind::kInvalidArgument,
              "batch " + std::to_string(positions[b]) + " names sample " + std::to_string(sample) +
                  ", outside the split's " + std::to_string(split.num_rows()) + " samples");
      out[b].rows.push_back(split.global_row(sample));
    }
  }
  return out;
}

std::vector<std::vector<std::int64_t>> local_batches(const RankPlan& plan) {
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(plan.num_batches()));
  for (std::int64_t b = 0; b < plan.num_batches(); ++b) {
    const auto batch = plan.batch(b);
    out[static_cast<std::size_t>(b)].assign(batch.begin(), batch.end());
  }
  return out;
}

std::vector<std::int64_t> all_positions(std::size_t count) {
  std::vector<std::int64_t> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::int64_t>(i);
  return out;
}

LoaderOptions completed(LoaderOptions options) {
  if (options.cache.hidden_states_path.empty()) {
    options.cache.hidden_states_path = default_hidden_states_path(options.data_path);
  }
  // Noise belongs to the training split alone (the one place this rule is made): the other
  // splits' batches have none, and their options say so.
  if (options.split != Split::kTrain) {
    options.batch.noise.kind = NoiseKind::kNone;
    options.batch.noise.std = 0.0;
  }
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
  plan_options().validate();
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
    : options_(completed(std::move(options))), read_ahead_stream_(next_read_ahead_stream++) {
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
  close();
  device_stage_.reset();
  // Page-locked and device memory are freed by the device worker once the device has read them:
  // wait for that here, so a loader that is gone leaves none behind (unless a batch outlives it).
  const std::shared_ptr<DeviceWorker> worker = pipeline_->cuda_worker();
  pipeline_.reset();
  if (worker) worker->settle();
}

std::shared_ptr<BatchLease> Loader::next(CudaStream consumer) {
  std::shared_ptr<BatchLease> lease =
      device_stage_ ? device_stage_->next(consumer) : pipeline_->next(consumer);
  if (lease) mark_delivered(lease->index);
  return lease;
}

void Loader::mark_delivered(std::int64_t position) {
  std::lock_guard lock(state_mutex_);
  delivered_.insert(position);
}

void Loader::close() {
  stop();
  options_.source->forget_plan(read_ahead_stream_);
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
  metrics.source = options_.source->stats_report();
  metrics.read_ahead_memory = options_.source->read_ahead_memory();
  return metrics;
}

const RankPlan& Loader::plan(std::int64_t epoch, const WindowOrder& window_order) {
  auto found = plans_.find(epoch);
  if (found != plans_.end() && !window_order) return found->second;
  PlanOptions plan = options_.plan_options();
  plan.window_order = window_order;
  RankPlan planned = plan_rank(split_.seq_lens(), plan, options_.rank, epoch);
  if (plans_.size() >= 4) plans_.erase(plans_.begin());
  return plans_[epoch] = std::move(planned);
}

void Loader::set_epoch(std::int64_t epoch) {
  require(epoch >= 0, ErrorKind::kInvalidArgument,
          "epoch must be non-negative, got " + std::to_string(epoch));
  std::lock_guard lock(state_mutex_);
  epoch_ = epoch;
}

std::int64_t Loader::epoch() const {
  std::lock_guard lock(state_mutex_);
  return epoch_;
}

std::vector<std::int64_t> Loader::begin_epoch(const std::vector<std::vector<std::int64_t>>* local,
                                              bool fetch) {
  const std::int64_t epoch = this->epoch();
  std::vector<std::vector<std::int64_t>> planned;
  if (local == nullptr) {
    planned = local_batches(plan(epoch));
    local = &planned;
  }
  std::vector<std::int64_t> todo;
  {
    std::lock_guard lock(state_mutex_);
    delivered_.clear();
    if (restored_ && restored_->epoch == epoch) {
      for (const std::int64_t position : restored_->delivered) {
        if (position >= 0 && position < static_cast<std::int64_t>(local->size())) {
          delivered_.insert(position);
        }
      }
    }
    restored_.reset();
    begun_epoch_ = epoch;
    begun_batches_ = static_cast<std::int64_t>(local->size());
    for (std::int64_t b = 0; b < begun_batches_; ++b) {
      if (!delivered_.contains(b)) todo.push_back(b);
    }
  }
  if (fetch) {
    start_planned(epoch, std::make_shared<const std::vector<PlannedBatch>>(
                             global_batches(*local, todo, split_)));
  }
  return todo;
}

std::vector<std::int64_t> Loader::start_epoch(std::int64_t epoch) {
  set_epoch(epoch);
  return begin_epoch();
}

void Loader::plan_read_ahead(std::int64_t epoch,
                             const std::shared_ptr<const std::vector<PlannedBatch>>& batches) {
  ReadAheadPlan plan;
  plan.stream = read_ahead_stream_;
  plan.batches = batches;
  plan.budget_bytes = read_ahead_budget_bytes(options_.read_ahead_bytes, pool_bytes());
  if (options_.split != Split::kVal && options_.source->plans_next_epoch()) {
    const auto next = local_batches(this->plan(epoch + 1));
    plan.next = global_batches(next, all_positions(next.size()), split_);
  }
  options_.source->will_need(plan);
}

namespace {

std::string value_text(std::uint64_t value) { return std::to_string(value); }
std::string value_text(std::int64_t value) { return std::to_string(value); }
std::string value_text(int value) { return std::to_string(value); }
std::string value_text(bool value) { return value ? "true" : "false"; }
std::string value_text(const std::string& value) { return "'" + value + "'"; }
std::string value_text(double value) {
  // The shortest text that reads back as the value: 0.9, not 0.900000.
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return {text, result.ptr};
}

// Why a state saved as `saved` records positions of another plan than this loader's (`mine`), or
// nothing: the first key recorded in both whose values differ, the split's first.
std::optional<std::string> plan_difference(const LoaderState& saved, const LoaderState& mine,
                                           const StateKeyNames& names) {
  std::optional<std::string> why;
  auto check = [&](const char* key, const auto& was, const auto& is) {
    if (why || !was || !is || *was == *is) return;
    const auto named = names.find(key);
    const std::string name = named != names.end() ? named->second : std::string(key);
    why = "state_dict was saved with " + name + "=" + value_text(*was) + ", this loader has " +
          name + "=" + value_text(*is) +
          ": its batch positions are another plan's (a state resumes only the plan it was saved "
          "from)";
  };
  check("split", saved.split, mine.split);
  check("dataset_rows", saved.dataset_rows, mine.dataset_rows);
  check("train_ratio", saved.train_ratio, mine.train_ratio);
  check("world_size", saved.world_size, mine.world_size);
  check("rank", saved.rank, mine.rank);
  check("total_seq_len", saved.total_seq_len, mine.total_seq_len);
  check("seed", saved.seed, mine.seed);
  check("truncate", saved.truncate, mine.truncate);
  return why;
}

}  // namespace

LoaderState Loader::state() {
  LoaderState out;
  std::optional<std::int64_t> plan_epoch;
  {
    std::lock_guard lock(state_mutex_);
    if (restored_) {
      out = *restored_;
    } else if (begun_epoch_) {
      out.epoch = *begun_epoch_;
      out.delivered.assign(delivered_.begin(), delivered_.end());
      out.num_batches = begun_batches_;
    } else {
      out.epoch = epoch_;
      plan_epoch = epoch_;
    }
  }
  if (plan_epoch) out.num_batches = plan(*plan_epoch).num_batches();
  record_plan_keys(out);
  return out;
}

void Loader::record_plan_keys(LoaderState& out) const {
  out.seed = options_.batch.noise.seed;
  out.world_size = options_.plan.world_size;
  out.rank = options_.rank;
  out.total_seq_len = options_.batch.max_len;
  out.split = split_name(options_.split);
  if (options_.split != Split::kAll) out.train_ratio = options_.train_ratio;
  out.dataset_rows = split_.dataset->num_rows();
  out.truncate = options_.plan.truncate;
}

void Loader::restore(const LoaderState& state, const StateKeyNames& names) {
  LoaderState mine;
  record_plan_keys(mine);
  if (std::optional<std::string> why = plan_difference(state, mine, names)) {
    throw Error(ErrorKind::kInvalidArgument, *why);
  }
  set_epoch(state.epoch);
  LoaderState kept = state;
  std::sort(kept.delivered.begin(), kept.delivered.end());
  kept.delivered.erase(std::unique(kept.delivered.begin(), kept.delivered.end()),
                       kept.delivered.end());
  std::lock_guard lock(state_mutex_);
  restored_ = std::move(kept);
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
  start_planned(epoch, std::make_shared<const std::vector<PlannedBatch>>(std::move(batches)));
}

void Loader::start_planned(std::int64_t epoch,
                           std::shared_ptr<const std::vector<PlannedBatch>> batches) {
  // An epoch still running stops first (its claims on a read-ahead end), then the source learns
  // the new plan before the pipeline's first fetch.
  stop();
  plan_read_ahead(epoch, batches);
  pipeline_->start(static_cast<std::uint64_t>(epoch), std::move(batches));
  if (device_stage_) {
    device_stage_->start([pipeline = pipeline_.get()](CudaStream copy_stream) {
      return pipeline->next(copy_stream);
    });
  }
}

}  // namespace draftfeed
