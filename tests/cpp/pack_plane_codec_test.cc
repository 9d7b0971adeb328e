// The planes-zstd codec gives back every bf16 and FP8 bit pattern (NaN payloads, negative zero,
// infinities), at every size around its chunk boundaries; it compresses Gaussian bf16 values; a
// blob cut short or changed anywhere is refused, never read past its end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "draftfeed/common/xxh64.h"
#include "draftfeed/pack/plane_codec.h"

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
}

TEST(PlaneCodec, EveryFp8PatternComesBackAtOddSizes) {
  for (const std::size_t n : {0, 1, 2, 3, 255, 256, 257, 1001}) {
    std::vector<std::uint8_t> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::uint8_t>(i * 37 + 11);
    PlaneCodecOptions small;
    small.chunk_values = 64;
    EXPECT_EQ(round_trip(DType::kF8E4M3, bytes), bytes) << n;
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
  for (const std::size_t n : {0U, 1U, chunk - 1, chunk, chunk + 1, 3 * chunk + 5}) {
    const auto bytes = gaussian_bf16(n);
    EXPECT_EQ(round_trip(DType::kBF16, bytes, options), bytes) << n;
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

TEST(PlaneCodec, DamagedBlobsAreRefused) {
  PlaneCodecOptions options;
  options.chunk_values = 256;
  const auto bytes = gaussian_bf16(1000);
  const auto blob = plane_encode(DType::kBF16, bytes, options);
  std::vector<std::uint8_t> out(bytes.size());
  for (std::size_t cut = 0; cut < blob.size(); cut += 7) {
    const std::span<const std::uint8_t> part(blob.data(), cut);
    EXPECT_TRUE(plane_decode(DType::kBF16, part, out)) << "cut at " << cut;
  }
  // A changed byte is refused, or changed nothing the decoder reads (a zstd frame header bit
  // that does not change the frame's output): the bytes that come out are the original ones.
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

}  // namespace
}  // namespace draftfeed
