// The Loader (loader/loader.h) in C++: the split and its plan, an epoch delivered whole, the
// train-only noise rule and the validation loader's rule, the engine's threads sized from the
// source, and LoaderOptions' one check.
#include "draftfeed/loader/loader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kRows = 40;
constexpr std::int64_t kHidden = 16;
constexpr std::int64_t kLayers = 4;

class LoaderTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("loader");
    synthetic_.rows = kRows;
    synthetic_.min_len = 8;
    synthetic_.max_len = 40;
    synthetic_.seed = 5;
    const std::string data = (dir_ / "data").string();
    write_synthetic_dataset(data, synthetic_);
    SyntheticHiddenStateSpec spec;
    spec.hidden_size = kHidden;
    spec.layers = kLayers;
    spec.threads = 1;
    write_synthetic_hidden_states(
        data + "/hidden_states", kRows,
        [this](std::int64_t row, std::vector<std::int64_t>& ids) {
          std::vector<std::int64_t> mask;
          synthetic_row(synthetic_, row, &ids, &mask);
        },
        spec);
  }

  LoaderOptions options() const {
    LoaderOptions o;
    o.data_path = (dir_ / "data").string();
    o.train_ratio = 0.75;
    o.batch.max_len = 96;
    o.batch.hidden_size = kHidden;
    o.batch.num_target_layers = kLayers - 1;
    o.batch.dtype = DType::kF32;
    o.batch.noise.seed = 7;
    o.pipeline.num_threads = 2;
    o.pipeline.buffers = 2;
    o.pipeline.try_pin = false;
    return o;
  }

  // Every batch of `epoch`, as its hidden_states values, by plan index.
  static std::vector<std::vector<float>> epoch_hidden_states(Loader& loader, std::int64_t epoch) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(loader.plan(epoch).num_batches()));
    loader.start_epoch(epoch);
    while (auto lease = loader.next()) {
      const TensorSlot& slot = *lease->layout->find("hidden_states");
      std::vector<float>& values = out.at(static_cast<std::size_t>(lease->index));
      values.resize(slot.nbytes / sizeof(float));
      std::memcpy(values.data(), slot_data(*lease->layout, lease->memory, "hidden_states"),
                  slot.nbytes);
    }
    return out;
  }

  SyntheticOptions synthetic_;
};

TEST_F(LoaderTest, DeliversEveryBatchOfItsSplitsPlan) {
  Loader loader(options());
  EXPECT_EQ(loader.split().begin, 0);
  EXPECT_EQ(loader.split().end, 30);  // int(40 x 0.75)
  EXPECT_EQ(loader.options().cache.hidden_states_path, (dir_ / "data" / "hidden_states").string());
  const RankPlan& plan = loader.plan(0);
  PlanOptions plan_options;
  plan_options.max_len = 96;
  plan_options.seed = 7;
  const RankPlan expected = plan_rank(loader.split().seq_lens(), plan_options, 0, 0);
  EXPECT_EQ(plan.samples, expected.samples);
  EXPECT_EQ(plan.batch_offsets, expected.batch_offsets);
  ASSERT_GE(plan.num_batches(), 3);

  loader.start_epoch(0);
  std::set<std::int64_t> seen;
  std::int64_t tokens = 0;
  while (auto lease = loader.next()) {
    EXPECT_TRUE(seen.insert(lease->index).second) << "batch " << lease->index << " twice";
    EXPECT_EQ(lease->used_samples, lease->planned_samples) << "every file is in the cache";
    tokens += lease->tokens;
  }
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), plan.num_batches());
  std::int64_t planned_tokens = 0;
  for (const std::int64_t local : plan.samples) {
    planned_tokens += std::min<std::int64_t>(96, loader.split().seq_lens()[local]);
  }
  EXPECT_EQ(tokens, planned_tokens);
}

TEST_F(LoaderTest, NoiseOnlyOnTheTrainingSplitDecidedOnceByTheLoader) {
  LoaderOptions noisy = options();
  noisy.batch.noise.std = 0.05;
  Loader train(noisy);
  EXPECT_TRUE(train.options().batch.noise.enabled());
  LoaderOptions quiet = options();
  Loader train_quiet(quiet);
  EXPECT_FALSE(train_quiet.options().batch.noise.enabled());
  const auto with_noise = epoch_hidden_states(train, 0);
  const auto without = epoch_hidden_states(train_quiet, 0);
  ASSERT_EQ(with_noise.size(), without.size());
  EXPECT_NE(with_noise, without) << "the training split is noised";

  // The validation loader of the noisy training loader: no noise, and its options say so.
  Loader val(train.options().validation());
  EXPECT_EQ(val.options().split, Split::kVal);
  EXPECT_EQ(val.options().batch.noise.kind, NoiseKind::kNone);
  EXPECT_EQ(val.options().batch.noise.std, 0.0);
  EXPECT_FALSE(val.options().batch.noise.enabled());
  LoaderOptions plain_val = options();
  plain_val.split = Split::kVal;
  plain_val.batch.noise.seed = 0;
  Loader val_quiet(plain_val);
  const auto val_values = epoch_hidden_states(val, 1);
  ASSERT_FALSE(val_values.empty());
  EXPECT_EQ(val_values, epoch_hidden_states(val_quiet, 1));
}

TEST_F(LoaderTest, TheValidationLoaderIsPlannedWithSeedZeroAndEveryBatch) {
  LoaderOptions o = options();
  o.batch.noise.seed = 99;
  o.plan.max_batches = 1;
  const LoaderOptions val = o.validation();
  EXPECT_EQ(val.split, Split::kVal);
  EXPECT_EQ(val.batch.noise.seed, 0u);
  EXPECT_FALSE(val.plan.max_batches.has_value());
  Loader train(o);
  EXPECT_EQ(train.plan(0).num_batches(), 1);
  Loader all(o.validation());
  EXPECT_GT(all.plan(0).num_batches(), 1);
}

// Fetches that block until `target` of them run at once: the most that ran together is what the
// pipeline's threads allow. After one wait ran out (too few threads) the others do not wait.
class BlockingSource : public SampleSource {
 public:
  BlockingSource(int blocking, int target) : blocking_(blocking), target_(target) {}
  FetchOutcome fetch(std::int64_t, const IntArrayView&) override {
    std::unique_lock lock(mutex_);
    ++running_;
    max_running_ = std::max(max_running_, running_);
    changed_.notify_all();
    if (!changed_.wait_for(lock, 2s, [this] { return max_running_ >= target_ || gave_up_; })) {
      gave_up_ = true;
    }
    --running_;
    return FetchOutcome::dropped(DropReason::kMissing, "none");
  }
  int blocking_fetches() const override { return blocking_; }
  int max_running() {
    std::lock_guard lock(mutex_);
    return max_running_;
  }

 private:
  const int blocking_;
  const int target_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int running_ = 0;
  int max_running_ = 0;
  bool gave_up_ = false;
};

TEST_F(LoaderTest, TheEngineRunsAThreadPerFetchTheSourceMayKeepBlocked) {
  LoaderOptions o = options();
  o.pipeline.num_threads = 1;
  auto source = std::make_shared<BlockingSource>(/*blocking=*/3, /*target=*/4);
  o.source = source;
  Loader loader(o);
  loader.start_epoch(0);
  while (loader.next()) {
  }
  EXPECT_EQ(source->max_running(), 4) << "1 thread of its own + 3 for the source's fetches";
}

TEST_F(LoaderTest, OptionsAreCheckedOnceNamingTheField) {
  auto refused = [](LoaderOptions o, const char* words) {
    try {
      Loader loader(std::move(o));
      ADD_FAILURE() << "accepted; expected an error naming " << words;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument) << error.what();
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
  };
  LoaderOptions o = options();
  o.rank = 2;
  refused(o, "outside world_size");
  o = options();
  o.batch.dtype = DType::kF16;
  refused(o, "float16");
  o = options();
  o.batch.noise.std = -1;
  refused(o, "noise_std");
  o = options();
  o.cache.on_missing = OnMissing::kGenerate;
  refused(o, "online source");
  o = options();
  o.cache.fp8_dequantize_dtype = DType::kI64;
  refused(o, "fp8_dequantize_dtype");
  o = options();
  o.pipeline.num_threads = 0;
  refused(o, "thread");
  o = options();
  o.pipeline.device_stage = true;
  o.batch.preprocess = Preprocess::kCustom;
  refused(o, "device stage");
  o = options();
  o.split = Split::kAll;
  o.train_ratio = 5;  // no split is made: not checked
  EXPECT_EQ(Loader(o).split().end, kRows);
  o.split = Split::kTrain;
  refused(o, "(0, 1)");
}

}  // namespace
}  // namespace draftfeed
