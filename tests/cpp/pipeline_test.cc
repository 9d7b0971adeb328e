// The pipeline with an in-memory sample source: delivery orders, packing after drops (including
// non-finite samples found during the copy), fatal errors, and prompt stops. Suites are named
// Pipeline* so CI also runs them under ThreadSanitizer.
#include "draftfeed/pipeline/pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/dataset/dataset_writer.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kHidden = 8;
constexpr std::int64_t kLayers = 4;

// A value every (row, token, layer, h) has, exactly representable in bf16.
float expected_value(std::int64_t row, std::int64_t token, std::int64_t layer, std::int64_t h) {
  return static_cast<float>((row * 7 + token * 3 + layer * 5 + h) % 64) - 32.0f;
}

class MemorySource : public SampleSource {
 public:
  std::set<std::int64_t> missing, nonfinite, throws;
  std::set<std::int64_t> unknown_dtype;  // rows served in a dtype the copy does not know
  std::set<std::int64_t>
      blocks;  // rows whose fetch waits until interrupt(), like a stalled request
  bool jitter = true;
  std::atomic<int> interrupts{0};
  std::atomic<int> resumes{0};

  void interrupt() override {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
    ++interrupts;
    changed_.notify_all();
  }
  void resume() override {
    std::lock_guard lock(mutex_);
    interrupted_ = false;
    ++resumes;
  }

  FetchOutcome fetch(std::int64_t row, const IntArrayView& ids) override {
    if (blocks.count(row)) {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return interrupted_; });
      return FetchOutcome::dropped(DropReason::kGenerationFailed, "interrupted");
    }
    if (jitter) {
      std::this_thread::sleep_for(std::chrono::microseconds((row * 7919) % 500));
    }
    if (throws.count(row))
      throw Error(ErrorKind::kRuntime, "source failed on row " + std::to_string(row));
    if (missing.count(row)) return FetchOutcome::dropped(DropReason::kMissing, "missing");
    auto values = std::make_shared<std::vector<std::uint16_t>>(
        static_cast<std::size_t>(ids.size() * kLayers * kHidden));
    std::size_t k = 0;
    for (std::int64_t t = 0; t < ids.size(); ++t)
      for (std::int64_t l = 0; l < kLayers; ++l)
        for (std::int64_t h = 0; h < kHidden; ++h)
          (*values)[k++] = float_to_bf16(expected_value(row, t, l, h));
    if (nonfinite.count(row) && !values->empty())
      values->front() = 0x7FC0;  // NaN in the first token
    FetchedSample sample;
    sample.owner = values;
    sample.hidden = {reinterpret_cast<const std::uint8_t*>(values->data()), DType::kBF16,
                     ids.size(), kLayers, kHidden};
    if (unknown_dtype.count(row)) sample.hidden.dtype = static_cast<DType>(77);
    return FetchOutcome::ok(std::move(sample));
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool interrupted_ = false;
};

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = std::filesystem::temp_directory_path() /
              ("draftfeed_pipeline_test_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(folder_);
    DatasetWriter writer(folder_.string());
    for (std::int64_t row = 0; row < 40; ++row) {
      const std::int64_t n = 3 + (row * 13) % 29;
      std::vector<std::int64_t> ids(n), mask(n);
      for (std::int64_t t = 0; t < n; ++t) {
        ids[t] = row * 1000 + t;
        mask[t] = (t + row) % 3 == 0 ? 0 : 1;
      }
      writer.add_row(ids, mask);
    }
    writer.finish();
    dataset_ = TokenDataset::open(folder_.string());
    source_ = std::make_shared<MemorySource>();
  }
  void TearDown() override { std::filesystem::remove_all(folder_); }

  std::vector<PlannedBatch> plan() const {
    // Batches of 4 consecutive rows; 48 rows of capacity make the last sample cross max_len often.
    std::vector<PlannedBatch> batches;
    for (std::int64_t b = 0; b < 10; ++b) {
      PlannedBatch batch{b, {}};
      for (std::int64_t i = 0; i < 4; ++i) batch.rows.push_back((b * 4 + i * 9) % 40);
      batches.push_back(batch);
    }
    return batches;
  }

  std::unique_ptr<Pipeline> make(bool in_order, int threads = 3, int buffers = 3,
                                 Preprocess preprocess = Preprocess::kNone) {
    BatchSpec spec;
    spec.preprocess = preprocess;
    spec.max_len = 48;
    spec.hidden_size = kHidden;
    spec.num_target_layers = kLayers - 1;
    PipelineOptions options;
    options.num_threads = threads;
    options.buffers = buffers;
    options.in_order = in_order;
    options.chunk_bytes = 64 * 4;  // tiny chunks: many copy tasks per sample
    return std::make_unique<Pipeline>(make_batch_layout(spec), dataset_, source_, options);
  }

  // Checks every row of a delivered batch against the source's values and the reference packing.
  void check_batch(const BatchLease& lease, const PlannedBatch& planned) {
    const BatchLayout& layout = *lease.layout;
    std::vector<std::int64_t> rows;
    std::vector<std::uint8_t> usable;
    for (const std::int64_t row : planned.rows) {
      usable.push_back(!source_->missing.count(row) && !source_->nonfinite.count(row) ? 1 : 0);
      rows.push_back(dataset_->input_ids(row).size());
    }
    const BatchPlacement expected = place_samples(layout.spec.max_len, rows, usable);
    ASSERT_EQ(lease.tokens, expected.used_rows);
    const auto* hs =
        reinterpret_cast<const std::uint16_t*>(slot_data(layout, lease.memory, "hidden_states"));
    const auto* last = reinterpret_cast<const std::uint16_t*>(
        slot_data(layout, lease.memory, "verifier_last_hidden_states"));
    const auto* ids =
        reinterpret_cast<const std::int64_t*>(slot_data(layout, lease.memory, "input_ids"));
    const auto* docs =
        reinterpret_cast<const std::int64_t*>(slot_data(layout, lease.memory, "document_ids"));
    const std::int64_t width = (kLayers - 1) * kHidden;
    for (std::size_t d = 0; d < expected.samples.size(); ++d) {
      const SamplePlacement& p = expected.samples[d];
      const std::int64_t row = planned.rows[p.sample];
      for (std::int64_t r = 0; r < p.rows; ++r) {
        const std::int64_t at = p.dst_row + r;
        ASSERT_EQ(docs[at], static_cast<std::int64_t>(d));
        ASSERT_EQ(ids[at], row * 1000 + r);
        for (std::int64_t j = 0; j < width; ++j) {
          ASSERT_EQ(bf16_to_float(hs[at * width + j]),
                    expected_value(row, r, j / kHidden, j % kHidden));
        }
        for (std::int64_t h = 0; h < kHidden; ++h) {
          ASSERT_EQ(bf16_to_float(last[at * kHidden + h]), expected_value(row, r, kLayers - 1, h));
        }
      }
    }
    for (std::int64_t at = expected.used_rows; at < layout.spec.max_len; ++at) {
      ASSERT_EQ(docs[at], -1);
      ASSERT_EQ(ids[at], 0);
      for (std::int64_t j = 0; j < width; ++j) ASSERT_EQ(hs[at * width + j], 0);
    }
  }

  std::filesystem::path folder_;
  std::shared_ptr<const TokenDataset> dataset_;
  std::shared_ptr<MemorySource> source_;
};

TEST(PlaceSamplesTest, PacksUsableSamplesAndTruncatesTheOneCrossingMaxLen) {
  const BatchPlacement p = place_samples(10, {4, 3, 5, 2}, {1, 0, 1, 1});
  ASSERT_EQ(p.samples.size(), 3u);
  EXPECT_EQ(p.samples[0].dst_row, 0);
  EXPECT_EQ(p.samples[0].rows, 4);
  EXPECT_EQ(p.samples[1].sample, 2u);
  EXPECT_EQ(p.samples[1].dst_row, 4);
  EXPECT_EQ(p.samples[1].rows, 5);
  EXPECT_EQ(p.samples[2].sample, 3u);
  EXPECT_EQ(p.samples[2].rows, 1);  // crosses max_len: truncated
  EXPECT_EQ(p.documents, (std::vector<std::int64_t>{4, 5, 1}));
  EXPECT_EQ(p.used_rows, 10);

  const BatchPlacement crossing = place_samples(10, {4, 8, 5}, {1, 1, 1});
  ASSERT_EQ(crossing.samples.size(), 2u);
  EXPECT_EQ(crossing.samples[1].rows, 6);
  EXPECT_EQ(crossing.documents, (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ(crossing.used_rows, 10);

  // A sample that fills the batch exactly ends it: the next one is neither placed nor a document.
  const BatchPlacement exact = place_samples(10, {4, 6, 3}, {1, 1, 1});
  ASSERT_EQ(exact.samples.size(), 2u);
  EXPECT_EQ(exact.documents, (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ(exact.used_rows, 10);

  const BatchPlacement none = place_samples(10, {4}, {0});
  EXPECT_TRUE(none.locally_empty);
  EXPECT_TRUE(none.documents.empty());
}

TEST_F(PipelineTest, InOrderDeliversThePlanInOrderWithExactContents) {
  source_->missing = {5, 22};
  auto pipeline = make(/*in_order=*/true);
  const auto batches = plan();
  pipeline->start(0, batches);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    auto lease = pipeline->next();
    ASSERT_NE(lease, nullptr);
    ASSERT_EQ(lease->index, static_cast<std::int64_t>(b));
    check_batch(*lease, batches[b]);
  }
  EXPECT_EQ(pipeline->next(), nullptr);
  EXPECT_EQ(pipeline->metrics().dropped[static_cast<std::size_t>(DropReason::kMissing)], 2);
}

TEST_F(PipelineTest, AsReadyDeliversEveryBatchOnce) {
  auto pipeline = make(/*in_order=*/false, 4, 4);
  const auto batches = plan();
  pipeline->start(3, batches);
  std::set<std::int64_t> seen;
  while (auto lease = pipeline->next()) {
    EXPECT_TRUE(seen.insert(lease->index).second);
    check_batch(*lease, batches[static_cast<std::size_t>(lease->index)]);
  }
  EXPECT_EQ(seen.size(), batches.size());
}

TEST_F(PipelineTest, NonFiniteSampleIsDroppedAndLaterSamplesPackUp) {
  source_->nonfinite = {9, 18};
  auto pipeline = make(true);
  const auto batches = plan();
  pipeline->start(0, batches);
  std::int64_t dropped = 0;
  while (auto lease = pipeline->next()) {
    check_batch(*lease, batches[static_cast<std::size_t>(lease->index)]);
    dropped += lease->dropped[static_cast<std::size_t>(DropReason::kNonFinite)];
  }
  // check_batch has verified that rows 9 and 18 are absent and later samples packed up behind them.
  EXPECT_GE(dropped, 1);
}

TEST_F(PipelineTest, SourceExceptionIsRethrownByNext) {
  source_->throws = {13};
  auto pipeline = make(true);
  pipeline->start(0, plan());
  EXPECT_THROW(
      {
        while (pipeline->next()) {
        }
      },
      Error);
}

TEST_F(PipelineTest, StopMidEpochIsPromptAndRestartable) {
  auto pipeline = make(true, 2, 2);
  pipeline->start(0, plan());
  ASSERT_NE(pipeline->next(), nullptr);
  const auto before = std::chrono::steady_clock::now();
  pipeline->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(30));  // hang guard
  pipeline->start(1, plan());
  std::int64_t count = 0;
  while (pipeline->next()) ++count;
  EXPECT_EQ(count, 10);
}

TEST_F(PipelineTest, StopFromAnotherThreadInterruptsTheSourceAndWakesTheConsumer) {
  const auto batches = plan();
  source_->blocks = {batches[0].rows[0]};  // the first batch never completes by itself
  auto pipeline = make(true, 2, 2);
  pipeline->start(0, batches);
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pipeline->stop();  // e.g. the trainer closing its loader from a signal handler's thread
  });
  EXPECT_EQ(pipeline->next(), nullptr) << "the consumer waiting for batch 0 is released";
  pipeline->stop();  // the consumer's own stop, while the watchdog's may still be joining threads
  watchdog.join();
  EXPECT_EQ(source_->interrupts.load(), 1);
  EXPECT_EQ(source_->resumes.load(), 1);
  source_->blocks.clear();
  pipeline->start(1, batches);
  std::int64_t count = 0;
  while (pipeline->next()) ++count;
  EXPECT_EQ(count, 10);
}

TEST_F(PipelineTest, KeptBatchesGrowThePoolInsteadOfDeadlocking) {
  auto pipeline = make(true, 2, 2);
  pipeline->start(0, plan());
  std::vector<std::shared_ptr<BatchLease>> kept;
  while (auto lease = pipeline->next()) kept.push_back(lease);
  EXPECT_EQ(kept.size(), 10u);
  EXPECT_GE(pipeline->metrics().extra_buffers, 8);
  const auto batches = plan();
  for (const auto& lease : kept)
    check_batch(*lease, batches[static_cast<std::size_t>(lease->index)]);
}

}  // namespace
}  // namespace draftfeed

namespace draftfeed {
namespace {

// A failure in the assembly steps (here a sample in a dtype the copy does not know) ends the epoch
// through next(), naming the batch, instead of reaching std::terminate from a worker thread; the
// pipeline stays stoppable and restartable.
TEST_F(PipelineTest, AnExceptionWhileAssemblingIsRethrownByNextNamingTheBatch) {
  const auto batches = plan();
  source_->unknown_dtype = {batches[2].rows[0]};
  auto pipeline = make(true);
  pipeline->start(0, batches);
  try {
    while (pipeline->next()) {
    }
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos) << e.what();
  }
  pipeline->stop();
  source_->unknown_dtype.clear();
  pipeline->start(1, batches);
  int delivered = 0;
  while (pipeline->next()) ++delivered;
  EXPECT_EQ(delivered, 10);
}

// A batch kept after its pipeline is gone still has its layout (it owns it) and its buffer.
TEST_F(PipelineTest, AKeptBatchOutlivesItsPipeline) {
  std::shared_ptr<BatchLease> kept;
  const auto batches = plan();
  {
    auto pipeline = make(true);
    pipeline->start(0, batches);
    kept = pipeline->next();
    ASSERT_NE(kept, nullptr);
    pipeline->stop();
  }
  check_batch(*kept, batches[0]);
}

// Preprocess::kCustom: every usable sample unpacked with all its rows (for a callable), values
// and integer tensors in place; a batch whose samples need more rows than max_len gets a buffer of
// its own.
TEST_F(PipelineTest, CustomPreprocessDeliversEverySampleUnpacked) {
  std::vector<PlannedBatch> batches = plan();
  PlannedBatch overfull{10, {}};
  for (std::int64_t row = 0; row < 12; ++row) overfull.rows.push_back(row);  // far past 48 rows
  batches.push_back(overfull);
  source_->missing = {batches[1].rows[1]};
  auto pipeline = make(false, 3, 3, Preprocess::kCustom);
  pipeline->start(0, batches);
  int delivered = 0;
  while (auto lease = pipeline->next()) {
    ++delivered;
    const PlannedBatch& planned = batches[static_cast<std::size_t>(lease->index)];
    const BatchLayout& layout = *lease->layout;
    std::int64_t expected_rows = 0;
    for (const std::int64_t row : planned.rows) {
      if (!source_->missing.count(row)) expected_rows += dataset_->input_ids(row).size();
    }
    ASSERT_EQ(lease->placement.used_rows, expected_rows);
    const bool own_buffer = lease->memory.front() != lease->buffer->memory().front();
    EXPECT_EQ(own_buffer, expected_rows > 48) << "batch " << lease->index;
    EXPECT_GE(layout.spec.max_len, expected_rows);
    const auto* hs =
        reinterpret_cast<const std::uint16_t*>(slot_data(layout, lease->memory, "hidden_states"));
    const auto* ids =
        reinterpret_cast<const std::int64_t*>(slot_data(layout, lease->memory, "input_ids"));
    const auto* positions =
        reinterpret_cast<const std::int64_t*>(slot_data(layout, lease->memory, "position_ids"));
    const std::int64_t width = (kLayers - 1) * kHidden;
    for (const SamplePlacement& p : lease->placement.samples) {
      const std::int64_t row = lease->rows[p.sample];
      ASSERT_EQ(p.rows, dataset_->input_ids(row).size()) << "nothing truncated";
      for (std::int64_t r = 0; r < p.rows; ++r) {
        ASSERT_EQ(ids[p.dst_row + r], row * 1000 + r);
        ASSERT_EQ(positions[p.dst_row + r], r);
        ASSERT_EQ(bf16_to_float(hs[(p.dst_row + r) * width + width - 1]),
                  expected_value(row, r, kLayers - 2, kHidden - 1));
      }
    }
  }
  EXPECT_EQ(delivered, 11);
}

}  // namespace
}  // namespace draftfeed
