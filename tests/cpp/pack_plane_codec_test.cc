// The planes-zstd codec gives back every bf16 and FP8 bit pattern (NaN payloads, negative zero,
// infinities), at every size around its chunk boundaries, with either entropy coder; it
// compresses Gaussian bf16 values, Huffman (version 2) no worse than zstd (version 1); a blob cut
// short or changed anywhere is refused, never read past its end; version 1 blobs an earlier build
// wrote (tests/data/pack_v1) still decode to the bytes their hash names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "draftfeed/common/xxh64.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/pack/plane_codec.h"
#include "draftfeed/pack/shard_layout.h"

namespace draftfeed {
namespace {

std::vector<std::uint8_t> round_trip(DType dtype, const std::vector<std::uint8_t>& bytes,
                                     PlaneCodecOptions options = {}) {
  const std::vector<std::uint8_t> blob = plane_encode(dtype, bytes, options);
  std::vector<std::uint8_t> out(bytes.size(), 0xAA);
  const auto error = plane_decode(dtype, blob, out);
  EXPECT_FALSE(error) << error->what();
  return out;
}

TEST(Xxh64, KnownValues) {
  EXPECT_EQ(xxh64({}), 0xEF46DB3751D8E999ULL);
  const std::string abc = "abc";
  EXPECT_EQ(xxh64({reinterpret_cast<const std::uint8_t*>(abc.data()), abc.size()}),
            0x44BC2CF5AD770999ULL);
  const std::string long_text = "Nobody inspects the spammish repetition";
  EXPECT_EQ(xxh64({reinterpret_cast<const std::uint8_t*>(long_text.data()), long_text.size()}),
            0xFBCEA83C8A378BF1ULL);
  std::vector<std::uint8_t> counting(2560);
  for (std::size_t i = 0; i < counting.size(); ++i) counting[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(xxh64(counting), 0x33FFECC78862A044ULL);  // the xxhash package's value
}

PlaneCodecOptions with_zstd() {
  PlaneCodecOptions options;
  options.entropy = PlaneEntropy::kZstd;
  return options;
}

TEST(PlaneCodec, EveryBf16PatternComesBack) {
  std::vector<std::uint8_t> bytes(2 * 65536);
  for (std::uint32_t v = 0; v < 65536; ++v) {
    bytes[2 * v] = static_cast<std::uint8_t>(v);
    bytes[2 * v + 1] = static_cast<std::uint8_t>(v >> 8);
  }
  PlaneCodecOptions small;
  small.chunk_values = 1000;
  EXPECT_EQ(round_trip(DType::kBF16, bytes), bytes);
  EXPECT_EQ(round_trip(DType::kBF16, bytes, small), bytes);
  EXPECT_EQ(round_trip(DType::kBF16, bytes, with_zstd()), bytes);
}

TEST(PlaneCodec, EveryFp8PatternComesBackAtOddSizes) {
  for (const std::size_t n : {0, 1, 2, 3, 255, 256, 257, 1001}) {
    std::vector<std::uint8_t> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(i * 37 + 11);
    PlaneCodecOptions small;
    small.chunk_values = 64;
    EXPECT_EQ(round_trip(DType::kF8E4M3, bytes), bytes) << n;
    small.entropy = PlaneEntropy::kHuffman;
    EXPECT_EQ(round_trip(DType::kF8E4M3, bytes, small), bytes) << n;
    small.entropy = PlaneEntropy::kZstd;
    EXPECT_EQ(round_trip(DType::kF8E4M3, bytes, small), bytes) << n;
  }
}

std::vector<std::uint8_t> gaussian_bf16(std::size_t values) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<std::uint8_t> bytes(2 * values);
  for (std::size_t i = 0; i < values; ++i) {
    const std::uint16_t b = float_to_bf16(normal(gen));
    std::memcpy(&bytes[2 * i], &b, 2);
  }
  return bytes;
}

TEST(PlaneCodec, SizesAroundTheChunkBoundary) {
  const std::uint32_t chunk = 128;
  PlaneCodecOptions options;
  options.chunk_values = chunk;
  for (const PlaneEntropy entropy : {PlaneEntropy::kHuffman, PlaneEntropy::kZstd}) {
    options.entropy = entropy;
    for (const std::size_t n : {0U, 1U, chunk - 1, chunk, chunk + 1, 3 * chunk + 5}) {
      const auto bytes = gaussian_bf16(n);
      EXPECT_EQ(round_trip(DType::kBF16, bytes, options), bytes) << n;
    }
  }
}

TEST(PlaneCodec, GaussianBf16Compresses) {
  const auto bytes = gaussian_bf16(1 << 18);
  const auto blob = plane_encode(DType::kBF16, bytes);
  // Gaussian exponents carry about 3 bits in 8; signs and mantissas 8 in 8.
  EXPECT_LT(static_cast<double>(blob.size()) / static_cast<double>(bytes.size()), 0.72);
  const PlaneSizes sizes = plane_sizes(blob);
  EXPECT_EQ(sizes.exponent_raw, bytes.size() / 2);
  EXPECT_EQ(sizes.rest, bytes.size() / 2);
  EXPECT_EQ(sizes.header + sizes.exponent_stored + sizes.rest, blob.size());
}

TEST(PlaneCodec, HuffmanWritesVersionTwoNoLargerThanZstd) {
  const auto bytes = gaussian_bf16(1 << 18);
  const auto huffman = plane_encode(DType::kBF16, bytes);
  const auto zstd = plane_encode(DType::kBF16, bytes, with_zstd());
  EXPECT_EQ(huffman[4], 2);
  EXPECT_EQ(zstd[4], 1);
  const auto parsed = plane_parse(DType::kBF16, huffman, huffman.size(), bytes.size() / 2);
  ASSERT_TRUE(parsed.ok()) << parsed.error().what();
  for (const auto& chunk : parsed.value().chunks) EXPECT_EQ(chunk.mode, PlaneBlob::Mode::kHuffman);
  EXPECT_LE(plane_sizes(huffman).exponent_stored, plane_sizes(zstd).exponent_stored);
}

TEST(PlaneCodec, TheDefaultCoderIsHuffmanForBf16AndZstdForFp8) {
  const auto bf16 = plane_encode(DType::kBF16, gaussian_bf16(5000));
  std::vector<std::uint8_t> fp8(10000);
  for (std::size_t i = 0; i < fp8.size(); ++i) fp8[i] = static_cast<std::uint8_t>(0x30 + i % 7);
  const auto fp8_blob = plane_encode(DType::kF8E4M3, fp8);
  EXPECT_EQ(bf16[4], 2);
  EXPECT_EQ(fp8_blob[4], 1);
  EXPECT_EQ(plane_entropy_for(DType::kF8E4M3, PlaneEntropy::kHuffman), PlaneEntropy::kHuffman);
}

TEST(PlaneCodec, AVersionOneBlobHasNoHuffmanChunks) {
  const auto bytes = gaussian_bf16(1000);
  auto blob = plane_encode(DType::kBF16, bytes);
  blob[4] = 1;
  std::vector<std::uint8_t> out(bytes.size());
  const auto error = plane_decode(DType::kBF16, blob, out);
  ASSERT_TRUE(error);
  EXPECT_NE(std::string(error->what()).find("mode 2 (0 raw, 1 zstd)"), std::string::npos)
      << error->what();
  blob[4] = 3;
  EXPECT_TRUE(plane_decode(DType::kBF16, blob, out));
}

// Every compressed part of a shard an earlier build wrote (version 1: zstd) decodes, and to the
// bytes its blob's hash names (plane_decode checks it).
void expect_shard_decodes(const std::string& name, DType dtype) {
  const std::string path = std::string(DRAFTFEED_TEST_DATA) + "/pack_v1/" + name;
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().what();
  auto index = index_pack_shard(file.value()->tensors(), file.value()->metadata(), path);
  ASSERT_TRUE(index.ok()) << index.error().what();
  std::size_t decoded = 0;
  for (const auto& [row, sample] : index.value()) {
    for (const PackedPart& part : sample.parts) {
      if (!part.compressed) continue;
      EXPECT_EQ(part.view.data[4], 1) << "row " << row << " is not a version 1 blob";
      EXPECT_EQ(part.dtype, dtype);
      std::vector<std::uint8_t> out(part.decoded_bytes);
      const auto error = plane_decode(part.dtype, part.view.bytes(), out);
      EXPECT_FALSE(error) << "row " << row << ": " << error->what();
      ++decoded;
    }
  }
  EXPECT_GE(decoded, 3U);
}

TEST(PlaneCodec, ReadsTheVersionOneBlobsOfAnEarlierBuild) {
  expect_shard_decodes("bf16_shard-000000.safetensors", DType::kBF16);
  expect_shard_decodes("fp8_shard-000000.safetensors", DType::kF8E4M3);
}

class DamagedBlobs : public ::testing::TestWithParam<PlaneEntropy> {};

TEST_P(DamagedBlobs, AreRefused) {
  PlaneCodecOptions options;
  options.chunk_values = 256;
  options.entropy = GetParam();
  const auto bytes = gaussian_bf16(1000);
  const auto blob = plane_encode(DType::kBF16, bytes, options);
  std::vector<std::uint8_t> out(bytes.size());
  for (std::size_t cut = 0; cut < blob.size(); cut += 7) {
    const std::span<const std::uint8_t> part(blob.data(), cut);
    EXPECT_TRUE(plane_decode(DType::kBF16, part, out)) << "cut at " << cut;
  }
  // A changed byte is refused, or changed nothing the decoder reads (a zstd frame header bit
  // that does not change the frame's output, a Huffman stream's padding bit): the bytes that come
  // out are the original ones.
  std::size_t refused = 0;
  for (std::size_t at = 0; at < blob.size(); at += 5) {
    auto changed = blob;
    changed[at] ^= 0x10;
    std::fill(out.begin(), out.end(), 0);
    if (plane_decode(DType::kBF16, changed, out)) {
      ++refused;
    } else {
      EXPECT_EQ(out, bytes) << "byte " << at;
    }
  }
  EXPECT_GT(refused, blob.size() / 5 * 9 / 10);
  // The wrong dtype, the wrong size.
  EXPECT_TRUE(plane_decode(DType::kF8E4M3, blob, out));
  std::vector<std::uint8_t> shorter(bytes.size() - 2);
  EXPECT_TRUE(plane_decode(DType::kBF16, blob, shorter));
  EXPECT_THROW(plane_encode(DType::kF32, bytes), Error);
}

INSTANTIATE_TEST_SUITE_P(PlaneCodec, DamagedBlobs,
                         ::testing::Values(PlaneEntropy::kHuffman, PlaneEntropy::kZstd));

}  // namespace
}  // namespace draftfeed
