// The epoch driver both front ends use, the `draftfeed` command and the Python `Loader`: one split
// of a dataset, planned per epoch for one data-parallel rank with the multipack planner, fetched
// and assembled by a pipeline. The rules of a training run live here, once:
//   * the split: rows [0, int(n * train_ratio)) train, the rest val (or every row);
//   * noise only on the training split;
//   * the validation loader of a training run (LoaderOptions::validation): no noise, every batch,
//     planned with seed 0 whatever the training seed (speculators 0.9.0: runs with different seeds
//     are validated on the same batches), each epoch's validation planned with that epoch.
// And the state of a run, once: the epoch, the split-local plan turned into global rows, what the
// source reads ahead (this epoch's batches still to come and, when the source asks, the next
// epoch's: SampleSource::will_need), and which batches were delivered (state() / restore(): exact
// resume whatever the delivery order).
//
// Thread safety: one consumer thread; stop() may come from any thread (see Pipeline); state() and
// restore() from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/pipeline/device_stage.h"
#include "draftfeed/pipeline/pipeline.h"
#include "draftfeed/sampler/multipack.h"
#include "draftfeed/source/cache_source.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

// The rows a loader reads: the training split, the validation split, or every row.
enum class Split : std::uint8_t { kTrain, kVal, kAll };
Split parse_split(std::string_view text);  // "train", "val", "all"; kInvalidArgument otherwise
const char* split_name(Split split);

struct LoaderOptions {
  LoaderOptions() { batch.noise.kind = NoiseKind::kUniform; }  // noise_std > 0 turns it on

  std::string data_path;  // a `save_to_disk` folder
  Split split = Split::kTrain;
  double train_ratio = 0.9;  // in (0, 1) unless split is kAll
  int rank = 0;              // data-parallel rank, in [0, plan.world_size)
  BatchSpec batch;           // max_len is also the planner's; batch.noise.seed its seed too
  PlanLimits plan;           // world_size, truncate, max_batches (plan_options(): with batch's)
  PipelineOptions pipeline;  // threads, buffers, delivery order... (noise: set here)
  // The cache source's options, when `source` is null (cache.hidden_states_path empty:
  // <data_path>/hidden_states).
  CacheSourceOptions cache;
  std::shared_ptr<SampleSource> source;  // where hidden states come from; null: the cache folder
  // What the source may hold read ahead of the batch buffers (files read into the page cache,
  // samples fetched): the one setting of both read-aheads (read_ahead/byte_budget.h). 0: the
  // default, 4 x the batch buffers' bytes and at least 256 MiB.
  std::uint64_t read_ahead_bytes = 0;

  // The only check of the loader's own fields, then of its parts' (batch, plan, pipeline; cache
  // when there is no source): Error kInvalidArgument naming the field. train_ratio is checked
  // where the split is made (split_train_val).
  void validate() const;
  // The validation loader that goes with this training loader (see above).
  LoaderOptions validation() const;
  // The planner's options: `plan` with the batch's max_len and the noise seed.
  PlanOptions plan_options() const { return plan.with(batch.max_len, batch.noise.seed); }
};

// Which batches of which epoch a loader delivered: positions in the epoch's batch list (the plan,
// or the list begin_epoch was given), whatever order they came in. What the positions depend on
// (everything that makes the plan differ: the split and the dataset's rows, the ranks, the batch
// length, the seed, the long-sample rule) is recorded beside them; restore() refuses a state
// saved with other values (those set: a state saved before a key was recorded still loads).
struct LoaderState {
  std::int64_t epoch = 0;
  std::vector<std::int64_t> delivered;  // ascending
  std::int64_t num_batches = 0;
  std::optional<std::uint64_t> seed;
  std::optional<int> world_size;
  std::optional<int> rank;
  std::optional<std::int64_t> total_seq_len;
  std::optional<std::string> split;          // "train", "val" or "all"
  std::optional<double> train_ratio;         // unless split is "all"
  std::optional<std::int64_t> dataset_rows;  // the whole dataset's
  std::optional<bool> truncate;              // long samples clipped (true) or dropped
};

// The names the user wrote for a state's keys where they differ (the drop-in's reference names:
// train_ratio is its train_data_ratio), for restore()'s messages.
using StateKeyNames = std::map<std::string, std::string, std::less<>>;

class Loader {
 public:
  // Opens the dataset (or shares `dataset`, already open), checks the options (Error
  // kInvalidArgument naming the field) and sets up the pipeline's buffers.
  explicit Loader(LoaderOptions options, std::shared_ptr<const TokenDataset> dataset = nullptr);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const LoaderOptions& options() const { return options_; }
  const DatasetSplit& split() const { return split_; }
  const std::shared_ptr<const TokenDataset>& dataset() const { return split_.dataset; }

  // This rank's batches of `epoch`, as split-local sample indices in packing order (the reference
  // sampler's `_generate_batches(epoch)`), planned once per epoch. `window_order` (multipack.h)
  // orders ties in each batch; without it the planner's own order applies.
  const RankPlan& plan(std::int64_t epoch, const WindowOrder& window_order = {});

  // The epoch begin_epoch runs (the reference sampler's set_epoch). Default 0.
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const;

  // Starts the epoch set by set_epoch: its batches (`local`: split-local sample indices, as plan()
  // gives them; null: the plan itself; a trainer's fast-skip passes a slice of it) except those a
  // restored state says were delivered. Tells the source what it will fetch (ReadAheadPlan), then
  // starts the pipeline, unless `fetch` is false (a sequence-parallel rank that is not its group's
  // data rank: it fetches nothing, and records each batch it steps over with mark_delivered).
  // Returns the positions to deliver, in plan order.
  std::vector<std::int64_t> begin_epoch(
      const std::vector<std::vector<std::int64_t>>* local = nullptr, bool fetch = true);
  // set_epoch(epoch), then begin_epoch() over its plan.
  std::vector<std::int64_t> start_epoch(std::int64_t epoch);
  // Starts delivering `batches` (global rows; PlannedBatch::index is the batch's position in the
  // epoch's plan); `epoch` keys the noise. What begin_epoch does after planning; for tools that
  // pick their own rows (resume state is not kept for them).
  void start(std::int64_t epoch, std::vector<PlannedBatch> batches);
  // The next batch, or null at the end of the epoch (see Pipeline::next); with the device stage,
  // in device memory (DeviceStage::next). `consumer`: the CUDA stream the consumer uses the batch
  // on (its copies, or its work on device batches); null is the default stream. Records the batch
  // as delivered.
  std::shared_ptr<BatchLease> next(CudaStream consumer = nullptr);
  void mark_delivered(std::int64_t position);
  void stop();
  // stop(), and the source forgets what it read ahead for this loader alone.
  void close();

  // The resume state (see LoaderState): a restored state not yet begun, else the epoch begun last,
  // else the epoch set with nothing delivered.
  LoaderState state();
  // The next begin_epoch of `state.epoch` delivers exactly the batches not in state.delivered;
  // sets the epoch. kInvalidArgument naming the first recorded value that differs from this
  // loader's, and both values ("state_dict was saved with train_ratio=0.9, this loader has
  // train_ratio=0.8: ..."), the key as `names` spells it.
  void restore(const LoaderState& state, const StateKeyNames& names = {});

  // With the device stage: where its device buffers' memory comes from from the next start() on
  // (null: the CUDA runtime's cudaMalloc, the default). Throws without the device stage.
  void set_device_allocator(std::shared_ptr<DeviceAllocator> allocator);

  PipelineMetrics metrics() const;
  // Where batch buffers are: page-locked for which device through which runtime, or why not.
  const std::string& pinning_detail() const { return pipeline_->pinning_detail(); }
  // The CUDA device every CUDA call is made on (pinned buffers, the device stage); -1: none.
  int cuda_device() const {
    return pipeline_->cuda_worker() ? pipeline_->cuda_worker()->device() : -1;
  }
  const BatchLayout& layout() const { return pipeline_->layout(); }
  std::size_t pool_bytes() const { return pipeline_->pool_bytes(); }

 private:
  // Sets the keys of `out` that say which plan its positions belong to (see LoaderState).
  void record_plan_keys(LoaderState& out) const;
  // The source's plan for this epoch (and the next, when it asks), before the pipeline starts.
  void plan_read_ahead(std::int64_t epoch,
                       const std::shared_ptr<const std::vector<PlannedBatch>>& batches);
  void start_planned(std::int64_t epoch, std::shared_ptr<const std::vector<PlannedBatch>> batches);

  LoaderOptions options_;
  DatasetSplit split_;
  const int read_ahead_stream_;  // this loader's in a shared source (ReadAheadPlan::stream)
  std::map<std::int64_t, RankPlan> plans_;  // by epoch: the latest few
  mutable std::mutex state_mutex_;
  std::int64_t epoch_ = 0;
  std::optional<LoaderState> restored_;  // not yet begun
  std::optional<std::int64_t> begun_epoch_;
  std::set<std::int64_t> delivered_;  // of begun_epoch_
  std::int64_t begun_batches_ = 0;
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<DeviceStage> device_stage_;  // after pipeline_: destroyed first
};

}  // namespace draftfeed
