// The Loader as the epoch driver (loader/loader.h): what it tells the source before the first fetch
// (this epoch's batches, the next epoch's when the source asks and the loader trains), exact resume
// from its own state, a trainer's slice of the plan, and forgetting its plan when it goes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/loader/loader.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kRows = 60;

// Records the plans it is told and the rows fetched before any plan; every fetch is a drop (no
// hidden states needed to check the driver).
class PlanRecordingSource : public SampleSource {
 public:
  explicit PlanRecordingSource(bool wants_next) : wants_next_(wants_next) {}

  FetchOutcome fetch(std::int64_t row, const IntArrayView&) override {
    std::lock_guard lock(mutex_);
    if (plans.empty()) fetched_before_plan.push_back(row);
    return FetchOutcome::dropped(DropReason::kMissing, "no file");
  }
  void will_need(const ReadAheadPlan& plan) override {
    std::lock_guard lock(mutex_);
    plans.push_back(plan);
  }
  bool plans_next_epoch() const override { return wants_next_; }
  void forget_plan(int stream) override {
    std::lock_guard lock(mutex_);
    forgotten.push_back(stream);
  }

  std::vector<ReadAheadPlan> plans;
  std::vector<std::int64_t> fetched_before_plan;
  std::vector<int> forgotten;

 private:
  const bool wants_next_;
  std::mutex mutex_;
};

class LoaderEpochTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("loader_epoch");
    SyntheticOptions synthetic;
    synthetic.rows = kRows;
    synthetic.min_len = 8;
    synthetic.max_len = 40;
    synthetic.seed = 3;
    write_synthetic_dataset((dir_ / "data").string(), synthetic);
  }

  LoaderOptions options(const std::shared_ptr<SampleSource>& source) const {
    LoaderOptions o;
    o.data_path = (dir_ / "data").string();
    o.train_ratio = 0.8;
    o.batch.max_len = 64;
    o.batch.hidden_size = 8;
    o.batch.num_target_layers = 2;
    o.batch.dtype = DType::kF32;
    o.batch.noise.seed = 11;
    o.pipeline.num_threads = 2;
    o.pipeline.buffers = 2;
    o.pipeline.try_pin = false;
    o.source = source;
    return o;
  }

  // Delivers the epoch begun and returns the positions delivered, in delivery order.
  static std::vector<std::int64_t> drain(Loader& loader) {
    std::vector<std::int64_t> out;
    while (auto lease = loader.next()) out.push_back(lease->index);
    return out;
  }

  // The plan's batches of `epoch` as global rows.
  static std::vector<std::vector<std::int64_t>> global_rows(Loader& loader, std::int64_t epoch) {
    const RankPlan& plan = loader.plan(epoch);
    std::vector<std::vector<std::int64_t>> out;
    for (std::int64_t b = 0; b < plan.num_batches(); ++b) {
      out.emplace_back();
      for (const std::int64_t local : plan.batch(b)) {
        out.back().push_back(loader.split().global_row(local));
      }
    }
    return out;
  }

  static std::vector<std::vector<std::int64_t>> rows_of(const std::vector<PlannedBatch>& batches) {
    std::vector<std::vector<std::int64_t>> out;
    for (const PlannedBatch& batch : batches) out.push_back(batch.rows);
    return out;
  }
};

TEST_F(LoaderEpochTest, TheSourceIsToldTheEpochInGlobalRowsBeforeAnyFetch) {
  auto source = std::make_shared<PlanRecordingSource>(/*wants_next=*/false);
  Loader loader(options(source));
  loader.start_epoch(2);
  const auto delivered = drain(loader);
  ASSERT_EQ(source->plans.size(), 1u);
  EXPECT_TRUE(source->fetched_before_plan.empty());
  const ReadAheadPlan& plan = source->plans[0];
  EXPECT_EQ(rows_of(*plan.batches), global_rows(loader, 2));
  EXPECT_TRUE(plan.next.empty()) << "the source did not ask for the next epoch";
  // The one budget rule (read_ahead/byte_budget.h): 4 x the batch buffers, at least 256 MiB.
  EXPECT_EQ(plan.budget_bytes, std::max<std::uint64_t>(4 * loader.pool_bytes(), 256U << 20));
  EXPECT_EQ(delivered.size(), plan.batches->size());
}

TEST_F(LoaderEpochTest, TheReadAheadBytesSettingIsThePlansBudget) {
  auto source = std::make_shared<PlanRecordingSource>(/*wants_next=*/false);
  LoaderOptions set = options(source);
  set.read_ahead_bytes = 12345;
  Loader loader(set);
  loader.start_epoch(0);
  drain(loader);
  ASSERT_EQ(source->plans.size(), 1u);
  EXPECT_EQ(source->plans[0].budget_bytes, 12345U);
}

TEST_F(LoaderEpochTest, TheNextEpochIsPlannedForTrainingOnlyWhenTheSourceAsks) {
  auto source = std::make_shared<PlanRecordingSource>(/*wants_next=*/true);
  Loader train(options(source));
  Loader val(options(source).validation());
  train.start_epoch(0);
  drain(train);
  val.start_epoch(0);
  drain(val);
  ASSERT_EQ(source->plans.size(), 2u);
  EXPECT_EQ(rows_of(source->plans[0].next), global_rows(train, 1));
  EXPECT_TRUE(source->plans[1].next.empty()) << "validation plans no next epoch";
  EXPECT_NE(source->plans[0].stream, source->plans[1].stream) << "each loader its own stream";
}

TEST_F(LoaderEpochTest, ARestoredStateDeliversExactlyTheOtherBatches) {
  auto source = std::make_shared<PlanRecordingSource>(false);
  LoaderState saved;
  std::int64_t total = 0;
  {
    Loader first(options(source));
    first.set_epoch(1);
    const std::vector<std::int64_t> todo = first.begin_epoch();
    total = static_cast<std::int64_t>(todo.size());
    ASSERT_GE(total, 4);
    for (int i = 0; i < 3; ++i) ASSERT_NE(first.next(), nullptr);
    saved = first.state();
    first.stop();
  }
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.delivered.size(), 3u);
  EXPECT_EQ(saved.num_batches, total);
  EXPECT_TRUE(std::is_sorted(saved.delivered.begin(), saved.delivered.end()));

  Loader resumed(options(source));
  resumed.restore(saved);
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(resumed.state().delivered, saved.delivered) << "the restored state until it begins";
  resumed.begin_epoch();
  const auto rest = drain(resumed);
  std::set<std::int64_t> all(saved.delivered.begin(), saved.delivered.end());
  for (const std::int64_t position : rest) {
    EXPECT_TRUE(all.insert(position).second) << "batch " << position << " delivered twice";
  }
  EXPECT_EQ(static_cast<std::int64_t>(all.size()), total);
  EXPECT_EQ(resumed.state().delivered.size(), static_cast<std::size_t>(total));
  // Only the batches still to come were planned ahead.
  EXPECT_EQ(source->plans.back().batches->size(), rest.size());

  // Another epoch than the restored one starts whole.
  Loader other(options(source));
  other.restore(saved);
  other.set_epoch(2);
  EXPECT_EQ(static_cast<std::int64_t>(other.begin_epoch().size()), other.plan(2).num_batches());
  other.stop();
}

TEST_F(LoaderEpochTest, AStateFromAnotherRunIsRefusedNamingTheKey) {
  auto source = std::make_shared<PlanRecordingSource>(false);
  Loader loader(options(source));
  LoaderState saved = loader.state();
  saved.seed = 12;
  try {
    loader.restore(saved);
    ADD_FAILURE() << "a state saved with another seed was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("seed=12"), std::string::npos) << error.what();
  }
  saved = loader.state();
  saved.seed.reset();  // keys not recorded are not checked
  saved.delivered = {0};
  loader.restore(saved);
}

TEST_F(LoaderEpochTest, AStateOfAnotherSplitIsRefusedNamingBothValues) {
  auto source = std::make_shared<PlanRecordingSource>(false);
  LoaderState saved;
  {
    Loader first(options(source));
    first.begin_epoch();
    ASSERT_NE(first.next(), nullptr);
    saved = first.state();
    first.stop();
  }
  EXPECT_EQ(saved.split, "train");
  EXPECT_EQ(saved.train_ratio, 0.8);
  EXPECT_EQ(saved.dataset_rows, kRows);
  EXPECT_EQ(saved.truncate, true);
  const std::string plan =
      ": its batch positions are another plan's (a state resumes only the "
      "plan it was saved from)";
  auto refusal = [&](const LoaderOptions& o, const StateKeyNames& names = {}) {
    Loader other(o);
    try {
      other.restore(saved, names);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  LoaderOptions ratio = options(source);
  ratio.train_ratio = 0.7;
  EXPECT_EQ(refusal(ratio),
            "state_dict was saved with train_ratio=0.8, this loader has train_ratio=0.7" + plan);
  EXPECT_EQ(refusal(ratio, {{"train_ratio", "train_data_ratio"}}),
            "state_dict was saved with train_data_ratio=0.8, this loader has "
            "train_data_ratio=0.7" +
                plan);
  LoaderOptions val = options(source);
  val.split = Split::kVal;
  EXPECT_EQ(refusal(val),
            "state_dict was saved with split='train', this loader has split='val'" + plan);
  LoaderOptions dropping = options(source);
  dropping.plan.truncate = false;
  EXPECT_EQ(refusal(dropping),
            "state_dict was saved with truncate=true, this loader has truncate=false" + plan);
  LoaderOptions length = options(source);
  length.batch.max_len = 96;
  EXPECT_EQ(refusal(length),
            "state_dict was saved with total_seq_len=64, this loader has total_seq_len=96" + plan);

  // Another dataset (more rows) under the same path.
  SyntheticOptions more;
  more.rows = kRows + 5;
  more.min_len = 8;
  more.max_len = 40;
  more.seed = 3;
  std::filesystem::remove_all(dir_ / "data");
  write_synthetic_dataset((dir_ / "data").string(), more);
  EXPECT_EQ(refusal(options(source)),
            "state_dict was saved with dataset_rows=60, this loader has "
            "dataset_rows=65" +
                plan);
}

TEST_F(LoaderEpochTest, ATrainersSliceOfThePlanIsDeliveredByItsOwnPositions) {
  auto source = std::make_shared<PlanRecordingSource>(false);
  Loader loader(options(source));
  const RankPlan& plan = loader.plan(0);
  ASSERT_GE(plan.num_batches(), 3);
  std::vector<std::vector<std::int64_t>> slice;
  for (std::int64_t b = 2; b < plan.num_batches(); ++b) {
    const auto batch = plan.batch(b);
    slice.emplace_back(batch.begin(), batch.end());
  }
  loader.begin_epoch(&slice);
  auto delivered = drain(loader);
  std::sort(delivered.begin(), delivered.end());
  ASSERT_EQ(delivered.size(), slice.size());
  for (std::size_t i = 0; i < delivered.size(); ++i) {
    EXPECT_EQ(delivered[i], static_cast<std::int64_t>(i));
  }
  std::vector<std::vector<std::int64_t>> expected = global_rows(loader, 0);
  expected.erase(expected.begin(), expected.begin() + 2);
  EXPECT_EQ(rows_of(*source->plans.back().batches), expected);

  std::vector<std::vector<std::int64_t>> outside = {{loader.split().num_rows()}};
  EXPECT_THROW(loader.begin_epoch(&outside), Error);
}

TEST_F(LoaderEpochTest, ALoaderThatGoesMakesTheSourceForgetItsPlan) {
  auto source = std::make_shared<PlanRecordingSource>(false);
  int stream = -1;
  {
    Loader loader(options(source));
    loader.start_epoch(0);
    drain(loader);
    stream = source->plans.at(0).stream;
  }
  ASSERT_EQ(source->forgotten.size(), 1u);
  EXPECT_EQ(source->forgotten[0], stream);
}

// The loader reports what its source reports, whatever the source: a cache's file read-ahead.
TEST_F(LoaderEpochTest, MetricsCarryTheSourcesReport) {
  LoaderOptions o = options(nullptr);
  Loader loader(o);
  const PipelineMetrics metrics = loader.metrics();
  const StatsTree* read_ahead = metrics.source.group("read_ahead");
  ASSERT_NE(read_ahead, nullptr);
  EXPECT_EQ(read_ahead->values.at(0).first, "opened");
  const StatsTree all = stats_tree(metrics);
  EXPECT_NE(all.group("read_ahead"), nullptr);
  EXPECT_NE(all.group("dropped"), nullptr);
}

}  // namespace
}  // namespace draftfeed
