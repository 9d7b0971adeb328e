// The epoch driver both front ends use, the `draftfeed` command and the Python `Loader`: one split
// of a dataset, planned per epoch for one data-parallel rank with the multipack planner, fetched
// and assembled by a pipeline. The rules of a training run live here, once:
//   * the split: rows [0, int(n * train_ratio)) train, the rest val (or every row);
//   * noise only on the training split;
//   * the validation loader of a training run (LoaderOptions::validation): no noise, every batch,
//     planned with seed 0 whatever the training seed (speculators 0.9.0: runs with different seeds
//     are validated on the same batches), each epoch's validation planned with that epoch.
//
// Thread safety: one consumer thread; stop() may come from any thread (see Pipeline).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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
  PlanOptions plan;          // world_size, truncate, max_batches (max_len, seed: from batch)
  PipelineOptions pipeline;  // threads, buffers, delivery order... (noise: set here)
  // The cache source's options, when `source` is null (cache.hidden_states_path empty:
  // <data_path>/hidden_states).
  CacheSourceOptions cache;
  std::shared_ptr<SampleSource> source;  // where hidden states come from; null: the cache folder

  // The only check of the loader's own fields, then of its parts' (batch, plan, pipeline; cache
  // when there is no source): Error kInvalidArgument naming the field. train_ratio is checked
  // where the split is made (split_train_val).
  void validate() const;
  // The validation loader that goes with this training loader (see above).
  LoaderOptions validation() const;
};

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

  // Starts delivering `batches` (global rows; PlannedBatch::index is the batch's position in the
  // epoch's plan, which resume records); `epoch` keys the noise. start_epoch: the whole plan.
  void start(std::int64_t epoch, std::vector<PlannedBatch> batches);
  void start_epoch(std::int64_t epoch);
  // The next batch, or null at the end of the epoch (see Pipeline::next); with the device stage,
  // in device memory (DeviceStage::next). `consumer`: the CUDA stream the consumer uses the batch
  // on (its copies, or its work on device batches); null is the default stream.
  std::shared_ptr<BatchLease> next(CudaStream consumer = nullptr);
  void stop();

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
  LoaderOptions options_;
  DatasetSplit split_;
  std::map<std::int64_t, RankPlan> plans_;  // by epoch: the latest few
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<DeviceStage> device_stage_;  // after pipeline_: destroyed first
};

}  // namespace draftfeed
