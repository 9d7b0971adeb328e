// Cache files that change while an epoch reads them (another process truncating, rewriting or
// deleting them between the fetch, which maps and checks a file, and the copy into the batch):
// no SIGBUS reaches the process; a truncated or rewritten sample is dropped as invalid with the
// reason and its file named; a deleted one is still read whole (the mapping keeps it). Both ways
// the copy takes a cache file's rows (CacheCopy: read through the descriptor, as on a local disk,
// or from the mapping, as on a network file system). Suites are named Pipeline* so CI also runs
// them under ThreadSanitizer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/dataset/dataset_writer.h"
#include "draftfeed/pipeline/pipeline.h"
#include "draftfeed/source/cache_source.h"
#include "sample_file.h"
#include "sigbus_recovery.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kHidden = 64;
constexpr std::int64_t kLayers = 4;
constexpr std::int64_t kRows = 12;

float value_of(std::int64_t row, std::int64_t token, std::int64_t layer, std::int64_t h) {
  return static_cast<float>((row * 7 + token * 3 + layer * 5 + h) % 64) - 32.0f;
}

enum class Change { kTruncateToZero, kTruncateTail, kRewrite, kDelete };

// The cache source, with another process's change applied to a row's file right after the fetch
// (the file is mapped and checked; the copy comes next).
class ChangingSource : public SampleSource {
 public:
  ChangingSource(std::shared_ptr<CacheSampleSource> inner, std::shared_ptr<const CacheStore> store)
      : inner_(std::move(inner)), store_(std::move(store)) {}
  std::map<std::int64_t, Change> changes;

  FetchOutcome fetch(std::int64_t row, const IntArrayView& ids) override {
    FetchOutcome outcome = inner_->fetch(row, ids);
    const auto it = changes.find(row);
    if (it == changes.end()) return outcome;
    const std::string path = store_->path_for(row);
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    switch (it->second) {
      case Change::kTruncateToZero:  // every mapped page now lies past the end: SIGBUS
        EXPECT_EQ(::truncate(path.c_str(), 0), 0);
        break;
      case Change::kTruncateTail:  // the last page stays mapped: no SIGBUS, the tail reads 0
        EXPECT_EQ(::truncate(path.c_str(), st.st_size - 64), 0);
        break;
      case Change::kRewrite: {  // same size, other bytes, in place (as a writer reusing the name)
        const int fd = ::open(path.c_str(), O_WRONLY);
        EXPECT_GE(fd, 0);
        const std::vector<char> other(256, 0x11);
        EXPECT_EQ(::pwrite(fd, other.data(), other.size(), st.st_size - 256), 256);
        // The kernel updates the modification time on write, at its timestamp granularity; a
        // rewrite within the same tick as the original write would look unchanged to a stat,
        // so the test moves the time on explicitly.
        const struct timespec times[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 5, 0}};
        EXPECT_EQ(::futimens(fd, times), 0);
        ::close(fd);
        break;
      }
      case Change::kDelete:
        EXPECT_EQ(::unlink(path.c_str()), 0);
        break;
    }
    return outcome;
  }

 private:
  std::shared_ptr<CacheSampleSource> inner_;
  std::shared_ptr<const CacheStore> store_;
};

class PipelineFileChangeTest : public TempFolderTest,
                               public ::testing::WithParamInterface<CacheCopy> {
 protected:
  void SetUp() override {
    make_temp_folder("pipeline_file_change", {"cache"});
    DatasetWriter writer((dir_ / "data").string());
    for (std::int64_t row = 0; row < kRows; ++row) {
      const std::int64_t n = 20 + row;  // 20..31 tokens: 10-16 KB files, several pages each
      std::vector<std::int64_t> ids(n), mask(n, 1);
      for (std::int64_t t = 0; t < n; ++t) ids[t] = row * 1000 + t;
      writer.add_row(ids, mask);
      std::vector<std::uint16_t> hidden;
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t l = 0; l < kLayers; ++l)
          for (std::int64_t h = 0; h < kHidden; ++h)
            hidden.push_back(float_to_bf16(value_of(row, t, l, h)));
      write_sample_file((dir_ / "cache" / ("hs_" + std::to_string(row) + ".safetensors")).string(),
                        ids, DType::kBF16, kLayers, kHidden, hidden);
    }
    writer.finish();
    dataset_ = TokenDataset::open((dir_ / "data").string());
    CacheSourceOptions options;
    options.hidden_states_path = (dir_ / "cache").string();
    options.on_missing = OnMissing::kWarn;
    options.copy = GetParam();
    store_ = std::make_shared<const CacheStore>(options.store());
    source_ = std::make_shared<ChangingSource>(std::make_shared<CacheSampleSource>(store_, options),
                                               store_);
  }

  // Batches of 3 rows in row order, with room for all three.
  std::vector<PlannedBatch> plan() const {
    std::vector<PlannedBatch> batches;
    for (std::int64_t b = 0; b < kRows / 3; ++b)
      batches.push_back({b, {3 * b, 3 * b + 1, 3 * b + 2}});
    return batches;
  }

  // Runs an epoch: every drop message, the number of samples kept, and the hidden states of each
  // kept sample checked against the values written.
  void run_epoch(std::vector<std::string>* drops, std::int64_t* kept_samples) {
    BatchSpec spec;
    spec.max_len = 128;
    spec.hidden_size = kHidden;
    spec.num_target_layers = kLayers - 1;
    PipelineOptions options;
    options.num_threads = 3;
    options.buffers = 2;
    options.max_drop_examples = 8;
    options.chunk_bytes = 4096;  // several copy tasks per sample
    Pipeline pipeline(make_batch_layout(spec), dataset_, source_, options);
    pipeline.start(0, plan());
    *kept_samples = 0;
    while (auto lease = pipeline.next()) {
      for (const auto& drop : lease->drop_messages) drops->push_back(drop.message);
      const auto* hs = reinterpret_cast<const std::uint16_t*>(
          slot_data(*lease->layout, lease->memory, "hidden_states"));
      const std::int64_t width = (kLayers - 1) * kHidden;
      for (const SamplePlacement& p : lease->placement.samples) {
        const std::int64_t row = lease->rows[p.sample];
        ++*kept_samples;
        for (std::int64_t r = 0; r < p.rows; ++r) {
          for (std::int64_t j = 0; j < width; ++j) {
            ASSERT_EQ(bf16_to_float(hs[(p.dst_row + r) * width + j]),
                      value_of(row, r, j / kHidden, j % kHidden))
                << "row " << row << " token " << r;
          }
        }
      }
    }
  }

  std::shared_ptr<const TokenDataset> dataset_;
  std::shared_ptr<const CacheStore> store_;
  std::shared_ptr<ChangingSource> source_;
};

bool any_contains(const std::vector<std::string>& messages, const std::string& a,
                  const std::string& b) {
  for (const auto& m : messages) {
    if (m.find(a) != std::string::npos && m.find(b) != std::string::npos) return true;
  }
  return false;
}

TEST_P(PipelineFileChangeTest, TruncatedRewrittenAndDeletedFilesNeverCrashTheEpoch) {
  SKIP_WHERE_SIGBUS_CANNOT_BE_RECOVERED();
  source_->changes = {{1, Change::kTruncateToZero},
                      {4, Change::kTruncateTail},
                      {7, Change::kRewrite},
                      {10, Change::kDelete}};
  std::vector<std::string> drops;
  std::int64_t kept = 0;
  ASSERT_NO_FATAL_FAILURE(run_epoch(&drops, &kept));
  ASSERT_EQ(drops.size(), 3u) << ::testing::PrintToString(drops);
  EXPECT_TRUE(any_contains(drops, "hs_1.safetensors", "shrank while being copied"))
      << ::testing::PrintToString(drops);
  // A tail cut off: the read of the rows comes up short, or (rows before the cut) the check
  // after the copy sees the new size.
  EXPECT_TRUE(any_contains(drops, "hs_4.safetensors", "shrank while being copied") ||
              any_contains(drops, "hs_4.safetensors", "changed size from"))
      << ::testing::PrintToString(drops);
  EXPECT_TRUE(any_contains(drops, "hs_7.safetensors", "was modified while being read"))
      << ::testing::PrintToString(drops);
  // Every other sample, the deleted file's included, arrived with its exact values (checked above).
  EXPECT_EQ(kept, kRows - 3);
}

TEST_P(PipelineFileChangeTest, ATruncatedFileIsDroppedAtTheFetchWhenItIsGoneBeforeTheCheck) {
  // Truncated before the fetch maps it: refused as a corrupt file, by the policy for invalid files.
  ASSERT_EQ(::truncate(store_->path_for(5).c_str(), 0), 0);
  std::vector<std::string> drops;
  std::int64_t kept = 0;
  ASSERT_NO_FATAL_FAILURE(run_epoch(&drops, &kept));
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_TRUE(any_contains(drops, "hs_5.safetensors", "shorter than the 8-byte header"));
  EXPECT_EQ(kept, kRows - 1);
}

INSTANTIATE_TEST_SUITE_P(Copies, PipelineFileChangeTest,
                         ::testing::Values(CacheCopy::kRead, CacheCopy::kMap),
                         [](const ::testing::TestParamInfo<CacheCopy>& info) {
                           return std::string(cache_copy_name(info.param));
                         });

}  // namespace
}  // namespace draftfeed
