// The batch copy that reads a cache file's rows through its descriptor (file_rows_copy.h) gives
// exactly what the copy from the file's mapping gives (copy_sample_rows), bit for bit, with the
// same non-finite count: straight into the batch (bf16 file, bf16 batch, no noise: the vectored
// read) and through the staging buffer (noise of every kind, an f32 batch's cast, MTP), for chunk
// edges that cut slices and the EAGLE-3 shift at the sample's end.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/file_rows_copy.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/mapped_file.h"
#include "draftfeed/hidden/safetensors.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kLayers = 4;
constexpr std::int64_t kHidden = 512;  // 4 KiB a token: a 512 KiB slice is 128 tokens
constexpr std::int64_t kTokens = 300;

struct Case {
  Preprocess preprocess;
  DType batch_dtype;
  NoiseKind noise;
};

class FileRowsCopyTest : public TempFolderTest, public ::testing::WithParamInterface<Case> {
 protected:
  void SetUp() override {
    make_temp_folder("file_rows_copy");
    std::vector<std::int64_t> ids(kTokens);
    for (std::int64_t t = 0; t < kTokens; ++t) ids[static_cast<std::size_t>(t)] = t % 1000;
    std::vector<std::uint16_t> hidden(static_cast<std::size_t>(kTokens * kLayers * kHidden));
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (auto& v : hidden) {
      const float f = normal(rng);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      v = static_cast<std::uint16_t>(bits >> 16);
    }
    // A few NaN and Inf, in target layers and in the last layer, at slice edges too.
    for (const std::int64_t at :
         {std::int64_t{5}, 128 * kLayers * kHidden + 3, (129 * kLayers + 3) * kHidden + 7,
          (299 * kLayers + 3) * kHidden}) {
      hidden[static_cast<std::size_t>(at)] = 0x7FC0;
    }
    hidden[static_cast<std::size_t>((200 * kLayers + 1) * kHidden)] = 0x7F80;
    path_ = (dir_ / "hs_0.safetensors").string();
    write_sample_file(path_, ids, DType::kBF16, kLayers, kHidden, hidden);
  }

  // The sample as the cache source gives it.
  FetchedSample fetch() const {
    auto file = SafetensorsFile::open(path_, MapOptions{.keep_descriptor = true}).value();
    const TensorView* hs = file->find("hidden_states");
    FetchedSample sample;
    sample.owner = file;
    sample.file = file->mapping();
    sample.hidden = HiddenStatesView{hs->data, DType::kBF16, kTokens, kLayers, kHidden};
    return sample;
  }

  std::string path_;
};

TEST_P(FileRowsCopyTest, GivesTheMappedCopysBytes) {
  const Case c = GetParam();
  BatchSpec spec;
  spec.max_len = 1024;
  spec.hidden_size = kHidden;
  spec.num_target_layers = kLayers - 1;
  spec.dtype = c.batch_dtype;
  spec.preprocess = c.preprocess;
  spec.noise.kind = c.noise;
  spec.noise.std = c.noise == NoiseKind::kNone ? 0.0 : 0.25;
  spec.noise.seed = 11;
  const BatchLayout layout = make_batch_layout(spec);
  const FetchedSample sample = fetch();
  ASSERT_TRUE(can_read_file_rows(sample));
  const std::int64_t rows = sample_rows_after_preprocess(c.preprocess, kTokens);
  const SamplePlacement placement{0, 17, rows};  // not at the batch's first row
  const NoiseContext noise{true, 3};

  // Chunks as the pipeline cuts them: the whole sample, and pieces whose edges cut slices.
  for (const auto& [first, last] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, rows}, {0, 1}, {37, 290 < rows ? 290 : rows}, {rows - 5, rows}}) {
    std::vector<std::uint8_t> expected(layout.total_bytes, 0xAB);
    std::vector<std::uint8_t> got(layout.total_bytes, 0xAB);
    const BatchMemory expected_memory = contiguous_memory(layout, expected.data());
    const BatchMemory got_memory = contiguous_memory(layout, got.data());
    const std::int64_t expected_bad =
        copy_sample_rows(layout, expected_memory, placement, sample.hidden, 42, noise, first, last);
    const FileRowsCopy copied =
        copy_file_rows(layout, got_memory, placement, sample, 42, noise, first, last);
    ASSERT_FALSE(copied.unreadable);
    EXPECT_EQ(copied.nonfinite, expected_bad) << "rows " << first << ".." << last;
    ASSERT_TRUE(got == expected) << "rows " << first << ".." << last;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ways, FileRowsCopyTest,
    ::testing::Values(Case{Preprocess::kEagle3Shift, DType::kBF16, NoiseKind::kNone},
                      Case{Preprocess::kEagle3Shift, DType::kBF16, NoiseKind::kUniform},
                      Case{Preprocess::kEagle3Shift, DType::kBF16, NoiseKind::kGaussian},
                      Case{Preprocess::kNone, DType::kBF16, NoiseKind::kUniform},
                      Case{Preprocess::kNone, DType::kBF16, NoiseKind::kNone},
                      Case{Preprocess::kEagle3Shift, DType::kF32, NoiseKind::kUniform},
                      Case{Preprocess::kNone, DType::kF32, NoiseKind::kNone},
                      Case{Preprocess::kMtp, DType::kBF16, NoiseKind::kNone}));

TEST_F(FileRowsCopyTest, AFileCutShortUnderTheReadIsUnreadable) {
  BatchSpec spec;
  spec.max_len = 1024;
  spec.hidden_size = kHidden;
  spec.num_target_layers = kLayers - 1;
  spec.preprocess = Preprocess::kEagle3Shift;
  const BatchLayout layout = make_batch_layout(spec);
  const FetchedSample sample = fetch();
  // Another process cuts the file in the middle of the hidden states, after it was opened.
  std::filesystem::resize_file(path_, sample.file->size() / 2);
  std::vector<std::uint8_t> batch(layout.total_bytes);
  const FileRowsCopy copied =
      copy_file_rows(layout, contiguous_memory(layout, batch.data()), SamplePlacement{0, 0, 299},
                     sample, 0, NoiseContext{}, 0, 299);
  EXPECT_TRUE(copied.unreadable);
}

}  // namespace
}  // namespace draftfeed
