// SampleCopy (batch/sample_copy.h), the one copy of a fetched sample's rows into a batch: what its
// chunks' copies find decides the sample's drop, with the message the pipeline reports (the
// values it copied, a file that shrank under the copy: SIGBUS on the mapping or a short read, a
// file rewritten since it was mapped), and finish() starts afresh for a copy after a repack.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/sample_copy.h"
#include "draftfeed/common/mapped_file.h"
#include "sigbus_recovery.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kLayers = 4;
constexpr std::int64_t kHidden = 512;  // 4 KiB a token: a page
constexpr std::int64_t kTokens = 64;
constexpr std::uint16_t kOne = 0x3F80;  // 1.0 in bf16
constexpr std::uint16_t kNaN = 0x7FC0;

class SampleCopyTest : public TempFolderTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    make_temp_folder("sample_copy");
    BatchSpec spec;
    spec.max_len = 128;
    spec.hidden_size = kHidden;
    spec.num_target_layers = kLayers - 1;
    layout_ = make_batch_layout(spec);
    batch_.assign(layout_.total_bytes, 0);
    values_.assign(static_cast<std::size_t>(kTokens * kLayers * kHidden), kOne);
    path_ = (dir_ / "hs_9").string();
  }

  // The rows as a file, mapped: its descriptor kept and its rows read when `read_rows`.
  FetchedSample file_sample(bool read_rows) {
    {
      std::ofstream out(path_, std::ios::binary);
      out.write(reinterpret_cast<const char*>(values_.data()),
                static_cast<std::streamsize>(values_.size() * 2));
    }
    auto mapped = MappedFile::open(path_, read_rows ? kMapForRowReads : MapOptions{});
    EXPECT_TRUE(mapped.ok());
    FetchedSample sample;
    sample.file = mapped.value();
    sample.hidden = HiddenStatesView{sample.file->data(), DType::kBF16, kTokens, kLayers, kHidden};
    sample.read_rows = read_rows;
    return sample;
  }

  // The rows from memory, as a transfer gives them: no file.
  FetchedSample memory_sample() const {
    FetchedSample sample;
    sample.hidden = HiddenStatesView{reinterpret_cast<const std::uint8_t*>(values_.data()),
                                     DType::kBF16, kTokens, kLayers, kHidden};
    return sample;
  }

  // Copies the sample's rows in two chunks, as two pipeline threads would; finish()'s drop.
  std::optional<FetchOutcome> copy(SampleCopy& copy, const FetchedSample& sample) {
    const BatchMemory memory = contiguous_memory(layout_, batch_.data());
    const std::int64_t rows = sample_rows_after_preprocess(layout_.spec.preprocess, kTokens);
    const SamplePlacement placement{0, 0, rows};
    copy.copy_rows(layout_, memory, placement, sample, 9, NoiseContext{}, rows / 2, rows);
    copy.copy_rows(layout_, memory, placement, sample, 9, NoiseContext{}, 0, rows / 2);
    return copy.finish(sample, 9);
  }

  BatchLayout layout_;
  std::vector<std::uint8_t> batch_;
  std::vector<std::uint16_t> values_;
  std::string path_;
};

TEST_P(SampleCopyTest, GoodRowsAreCopiedAndKept) {
  const FetchedSample sample = file_sample(GetParam());
  SampleCopy sample_copy;
  EXPECT_FALSE(copy(sample_copy, sample).has_value());
  const auto* hs = reinterpret_cast<const std::uint16_t*>(
      slot_data(layout_, contiguous_memory(layout_, batch_.data()), "hidden_states"));
  const std::int64_t rows = sample_rows_after_preprocess(layout_.spec.preprocess, kTokens);
  for (std::int64_t i = 0; i < rows * (kLayers - 1) * kHidden; ++i) ASSERT_EQ(hs[i], kOne) << i;
}

TEST_P(SampleCopyTest, NonFiniteValuesDropTheSampleOnceAndAreForgottenAfterwards) {
  values_[5] = kNaN;
  values_[static_cast<std::size_t>(40 * kLayers * kHidden + 3)] = kNaN;  // in the second chunk
  const FetchedSample sample = GetParam() ? file_sample(true) : memory_sample();
  SampleCopy sample_copy;
  const std::optional<FetchOutcome> drop = copy(sample_copy, sample);
  ASSERT_TRUE(drop.has_value());
  EXPECT_EQ(drop->reason, DropReason::kNonFinite);
  EXPECT_EQ(drop->message, "row 9: 2 non-finite hidden-state values");
  // What was found is gone once reported: finish() after no copy finds nothing.
  EXPECT_FALSE(sample_copy.finish(sample, 9).has_value());
}

TEST_P(SampleCopyTest, AFileThatShrankUnderTheCopyDropsTheSampleNamingIt) {
  if (!GetParam()) SKIP_WHERE_SIGBUS_CANNOT_BE_RECOVERED();
  const FetchedSample sample = file_sample(GetParam());
  std::filesystem::resize_file(path_, 4096);  // another process truncates it
  SampleCopy sample_copy;
  const std::optional<FetchOutcome> drop = copy(sample_copy, sample);
  ASSERT_TRUE(drop.has_value());
  EXPECT_EQ(drop->reason, DropReason::kInvalid);
  EXPECT_EQ(drop->message, "row 9: " + path_ +
                               ": the file shrank while being copied (truncated by another "
                               "process: a short read, or SIGBUS on the mapping)");
}

TEST_P(SampleCopyTest, AFileRewrittenSinceItWasMappedDropsTheSampleNamingIt) {
  const FetchedSample sample = file_sample(GetParam());
  std::filesystem::last_write_time(
      path_, std::filesystem::last_write_time(path_) + std::chrono::seconds(5));
  SampleCopy sample_copy;
  const std::optional<FetchOutcome> drop = copy(sample_copy, sample);
  ASSERT_TRUE(drop.has_value());
  EXPECT_EQ(drop->reason, DropReason::kInvalid);
  EXPECT_EQ(drop->message.rfind("row 9: " + path_ + ": the file ", 0), 0u) << drop->message;
}

INSTANTIATE_TEST_SUITE_P(Copies, SampleCopyTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "read" : "map");
                         });

}  // namespace
}  // namespace draftfeed
