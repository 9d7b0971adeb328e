// The batch copy of hidden states left compressed (batch/compressed_rows_copy.h through
// SampleCopy): the batch holds exactly what the copy of the decoded rows gives, for codec chunks
// that straddle rows and copy chunks, with the EAGLE-3 shift, noise, a cast and FP8 with its
// scales; a chunk that does not decode drops the sample with a message naming where it lies and
// the chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/sample_copy.h"
#include "draftfeed/pack/plane_codec.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kLayers = 3;
constexpr std::int64_t kHidden = 64;
constexpr std::int64_t kTokens = 50;
// Not a multiple of a row (192 values): chunks straddle rows, and copy chunks.
constexpr std::uint32_t kChunkValues = 1000;

struct Case {
  Preprocess preprocess;
  DType batch_dtype;
  bool noise;
  DType source = DType::kBF16;                    // or F8 E4M3, with a scale per token
  PlaneEntropy entropy = PlaneEntropy::kHuffman;  // or the version 1 blobs' zstd
};

class CompressedRowsCopyTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    BatchSpec spec;
    spec.max_len = 64;
    spec.hidden_size = kHidden;
    spec.num_target_layers = kLayers - 1;
    spec.preprocess = c.preprocess;
    spec.dtype = c.batch_dtype;
    if (c.noise) {
      spec.noise.kind = NoiseKind::kUniform;
      spec.noise.std = 0.1;
    }
    layout_ = make_batch_layout(spec);
    noise_.enabled = c.noise;
    noise_.epoch = 3;
    // Values of a few magnitudes (an exponent plane zstd compresses), signs and mantissas varied.
    const std::size_t count = static_cast<std::size_t>(kTokens * kLayers * kHidden);
    values_.resize(count * dtype_size(c.source));
    std::uint32_t state = 12345;
    for (std::size_t i = 0; i < count; ++i) {
      state = state * 1664525U + 1013904223U;
      if (c.source == DType::kF8E4M3) {
        // E4M3: exponents 5-8, never the NaN codes (exponent 15, mantissa 7).
        values_[i] = static_cast<std::uint8_t>(
            ((state >> 24) & 0x80U) | ((5 + (state >> 28) % 4) << 3) | ((state >> 8) & 7U));
        continue;
      }
      const auto exponent = static_cast<std::uint16_t>(124 + (state >> 28) % 4);
      const auto v = static_cast<std::uint16_t>(((state >> 16) & 0x8000U) | (exponent << 7) |
                                                ((state >> 8) & 0x7FU));
      std::memcpy(values_.data() + 2 * i, &v, 2);
    }
    scales_.resize(static_cast<std::size_t>(kTokens) * 4);
    for (std::int64_t t = 0; t < kTokens; ++t) {
      const float scale = 0.5f + 0.01f * static_cast<float>(t);
      std::memcpy(scales_.data() + 4 * t, &scale, 4);
    }
    PlaneCodecOptions options;
    options.entropy = c.entropy;
    options.chunk_values = kChunkValues;
    blob_ = plane_encode(c.source, values_, options);
    auto parsed = plane_parse(c.source, blob_, blob_.size(), count);
    ASSERT_TRUE(parsed.ok()) << parsed.error().what();
    planes_ = std::make_shared<CompressedPlanes>(CompressedPlanes{
        blob_.data(), parsed.value(), "shard-000000.safetensors, offset 8, row 7"});
    ASSERT_TRUE(coded(0));
  }

  // Whether chunk c's exponent plane is coded with the case's entropy coder (not stored raw).
  bool coded(std::size_t c) const {
    return planes_->planes.chunks[c].mode == (GetParam().entropy == PlaneEntropy::kHuffman
                                                  ? PlaneBlob::Mode::kHuffman
                                                  : PlaneBlob::Mode::kZstd);
  }

  FetchedSample plain() const {
    FetchedSample sample;
    sample.hidden = HiddenStatesView{values_.data(), GetParam().source, kTokens, kLayers, kHidden};
    if (GetParam().source == DType::kF8E4M3) sample.hidden.scales = scales_.data();
    return sample;
  }
  FetchedSample compressed() const {
    FetchedSample sample = plain();
    sample.hidden.data = nullptr;
    sample.read_rows = false;
    sample.compressed = planes_;
    return sample;
  }

  // The batch after copying the sample in copy chunks split at `cuts`, and finish()'s drop.
  std::vector<std::uint8_t> copy(const FetchedSample& sample, const std::vector<std::int64_t>& cuts,
                                 std::optional<FetchOutcome>* drop = nullptr) {
    std::vector<std::uint8_t> batch(layout_.total_bytes, 0);
    const BatchMemory memory = contiguous_memory(layout_, batch.data());
    const std::int64_t rows = sample_rows_after_preprocess(layout_.spec.preprocess, kTokens);
    const SamplePlacement placement{0, 2, rows};
    SampleCopy copier;
    std::int64_t begin = 0;
    for (std::size_t i = 0; i <= cuts.size(); ++i) {
      const std::int64_t end = i < cuts.size() ? std::min(cuts[i], rows) : rows;
      copier.copy_rows(layout_, memory, placement, sample, 7, noise_, begin, end);
      begin = end;
    }
    std::optional<FetchOutcome> outcome = copier.finish(sample, 7);
    if (drop != nullptr) *drop = std::move(outcome);
    return batch;
  }

  BatchLayout layout_;
  NoiseContext noise_;
  std::vector<std::uint8_t> values_;
  std::vector<std::uint8_t> scales_;
  std::vector<std::uint8_t> blob_;
  std::shared_ptr<CompressedPlanes> planes_;
};

TEST_P(CompressedRowsCopyTest, EqualsTheCopyOfTheDecodedRows) {
  const std::vector<std::uint8_t> expected = copy(plain(), {});
  for (const std::vector<std::int64_t>& cuts :
       std::vector<std::vector<std::int64_t>>{{}, {1}, {5, 6, 17, 30}, {13, 26, 39}}) {
    std::optional<FetchOutcome> drop;
    EXPECT_EQ(copy(compressed(), cuts, &drop), expected) << "cuts " << cuts.size();
    EXPECT_FALSE(drop.has_value()) << drop->message;
  }
}

TEST_P(CompressedRowsCopyTest, ACorruptChunkDropsTheSampleNamingWhereItLies) {
  std::size_t bad = 3;
  while (!coded(bad)) ++bad;
  // The plane's first byte: a zstd frame's magic number, a Huffman plane's first symbol (after
  // its last one), which every decode checks.
  blob_[planes_->planes.chunks[bad].at] ^= 0xFF;
  std::optional<FetchOutcome> drop;
  copy(compressed(), {20}, &drop);
  ASSERT_TRUE(drop.has_value());
  EXPECT_EQ(drop->reason, DropReason::kInvalid);
  EXPECT_NE(drop->message.find("row 7"), std::string::npos) << drop->message;
  EXPECT_NE(drop->message.find("shard-000000.safetensors, offset 8"), std::string::npos)
      << drop->message;
  EXPECT_NE(drop->message.find("chunk " + std::to_string(bad)), std::string::npos) << drop->message;
}

INSTANTIATE_TEST_SUITE_P(Copies, CompressedRowsCopyTest,
                         ::testing::Values(Case{Preprocess::kNone, DType::kBF16, false},
                                           Case{Preprocess::kEagle3Shift, DType::kBF16, true},
                                           Case{Preprocess::kEagle3Shift, DType::kF32, false},
                                           Case{Preprocess::kMtp, DType::kF32, true},
                                           Case{Preprocess::kEagle3Shift, DType::kBF16, true,
                                                DType::kF8E4M3},
                                           Case{Preprocess::kEagle3Shift, DType::kBF16, true,
                                                DType::kBF16, PlaneEntropy::kZstd},
                                           Case{Preprocess::kMtp, DType::kF32, false,
                                                DType::kF8E4M3, PlaneEntropy::kZstd}));

}  // namespace
}  // namespace draftfeed
