// The packed cache's manifest and shard index: a manifest written reads back the same; hostile
// manifests are refused naming the field; a shard assembled from encoded samples parses as a
// safetensors file and indexes back to each sample's parts.
#include "draftfeed/pack/pack_manifest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <vector>

#include "draftfeed/hidden/safetensors_writer.h"
#include "draftfeed/pack/shard_layout.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

std::span<const std::uint8_t> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

PackManifest two_samples() {
  PackManifest m;
  m.codec = "planes-zstd";
  m.shards = {{"shard-000000.safetensors", 1000}, {"shard-000001.safetensors", 500}};
  m.samples = {{7, 0, 100, 400, 0x0123456789abcdefULL, 900, CacheLayout::kFlat},
               {3, 1, 64, 400, 42, 800, CacheLayout::kSharded}};
  return m;
}

TEST(PackManifest, RoundTrip) {
  const PackManifest m = two_samples();
  auto parsed = parse_pack_manifest(bytes_of(pack_manifest_json(m)), "m");
  ASSERT_TRUE(parsed.ok()) << parsed.error().what();
  ASSERT_EQ(parsed->samples.size(), 2U);
  EXPECT_EQ(parsed->codec, "planes-zstd");
  EXPECT_EQ(parsed->samples[0].checksum, 0x0123456789abcdefULL);
  EXPECT_EQ(parsed->samples[1].layout, CacheLayout::kSharded);
  EXPECT_EQ(parsed->shards[1].file, "shard-000001.safetensors");
}

TEST(PackManifest, HostileManifestsAreRefusedByField) {
  const auto refused = [](PackManifest m, const std::string& expect) {
    auto parsed = parse_pack_manifest(bytes_of(pack_manifest_json(m)), "m.json");
    ASSERT_FALSE(parsed.ok());
    EXPECT_NE(std::string(parsed.error().what()).find(expect), std::string::npos)
        << parsed.error().what();
  };
  PackManifest path = two_samples();
  path.shards[0].file = "../shard-000000.safetensors";
  refused(path, "shards[0].file");
  PackManifest past = two_samples();
  past.samples[0].length = 901;
  refused(past, "lie past the end of shard-000000.safetensors");
  PackManifest twice = two_samples();
  twice.samples[1].row = 7;
  refused(twice, "listed twice");
  PackManifest overlap = two_samples();
  overlap.samples[1].shard = 0;
  overlap.samples[1].offset = 499;
  refused(overlap, "overlap");
  const std::string deep = "{\"samples\": " + std::string(100, '[') + std::string(100, ']') + "}";
  auto parsed = parse_pack_manifest(bytes_of(deep), "m.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(std::string(parsed.error().what()).find("nested"), std::string::npos);
}

TEST(PackShardName, OnlyCanonicalNames) {
  EXPECT_EQ(pack_shard_name(7), "shard-000007.safetensors");
  EXPECT_EQ(pack_shard_name(1234567), "shard-1234567.safetensors");
  EXPECT_TRUE(is_pack_shard_name("shard-000007.safetensors"));
  EXPECT_FALSE(is_pack_shard_name("shard-7.safetensors"));
  EXPECT_FALSE(is_pack_shard_name("shard-0000007.safetensors"));
  EXPECT_FALSE(is_pack_shard_name("../shard-000007.safetensors"));
  EXPECT_FALSE(is_pack_shard_name("shard-00000a.safetensors"));
}

class PackShardTest : public TempFolderTest {};

TEST_F(PackShardTest, EncodedSamplesIndexBack) {
  make_temp_folder("pack_shard");
  std::vector<std::int64_t> ids = {5, 6, 7};
  // Few distinct values: their exponents compress, so the second sample is stored compressed.
  std::vector<std::uint8_t> hs(3 * 2 * 512 * 2);
  for (std::size_t i = 0; i < hs.size() / 2; ++i) {
    const std::uint16_t v = float_to_bf16(static_cast<float>(i % 5) - 2.0f);
    std::memcpy(&hs[2 * i], &v, 2);
  }
  const std::vector<TensorToWrite> tensors = {
      {"token_ids", DType::kI64, {3}, {reinterpret_cast<const std::uint8_t*>(ids.data()), 24}},
      {"hidden_states", DType::kBF16, {3, 2, 512}, hs}};
  const std::string path = (dir_ / "hs_12.safetensors").string();
  write_safetensors(path, tensors);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  std::vector<EncodedSample> samples;
  samples.push_back(encode_pack_sample(12, *file.value(), /*compress=*/false));
  samples.push_back(encode_pack_sample(40, *file.value(), /*compress=*/true));
  const std::vector<const EncodedSample*> pointers = {&samples[0], &samples[1]};
  const std::string header = pack_shard_header(pointers, "planes-zstd");
  std::vector<std::uint8_t> shard(8);
  const std::uint64_t n = header.size();
  std::memcpy(shard.data(), &n, 8);
  shard.insert(shard.end(), header.begin(), header.end());
  for (const EncodedSample& s : samples) shard.insert(shard.end(), s.bytes.begin(), s.bytes.end());
  EXPECT_EQ((8 + header.size()) % 8, 0U);
  auto layout = parse_safetensors(shard, "shard");
  ASSERT_TRUE(layout.ok()) << layout.error().what();
  auto index = index_pack_shard(layout->tensors, layout->metadata, "shard");
  ASSERT_TRUE(index.ok()) << index.error().what();
  ASSERT_EQ(index->size(), 2U);
  const PackedSampleParts& plain = index->at(12);
  EXPECT_EQ(plain.begin, 8 + header.size());
  EXPECT_EQ(plain.end - plain.begin, samples[0].bytes.size());
  EXPECT_EQ(plain.header.nbytes, 8 + file.value()->header_size());
  for (const PackedPart& part : plain.parts) {
    EXPECT_FALSE(part.compressed);
    EXPECT_EQ(part.view.file_offset % std::max<std::size_t>(1, dtype_size(part.dtype)), 0U);
  }
  const PackedSampleParts& packed = index->at(40);
  bool found = false;
  for (const PackedPart& part : packed.parts) {
    if (part.name != "hidden_states") continue;
    found = part.compressed && part.dtype == DType::kBF16 &&
            part.shape == std::vector<std::int64_t>({3, 2, 512}) && part.decoded_bytes == hs.size();
    std::vector<std::uint8_t> out(part.decoded_bytes);
    EXPECT_FALSE(plane_decode(part.dtype, part.view.bytes(), out));
    EXPECT_EQ(out, hs);
  }
  EXPECT_TRUE(found);
  // A tensor renamed out of the <row>/<part> scheme is refused, naming it.
  std::map<std::string, std::string> metadata = layout->metadata;
  std::vector<TensorView> renamed = layout->tensors;
  renamed[1].name = "12.token_ids";
  auto bad = index_pack_shard(renamed, metadata, "shard");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.error().what()).find("12.token_ids"), std::string::npos);
}

// A manifest is hostile input too: a FIFO by its name is refused at once (a blocking open would
// wait for a writer forever), and a folder without one is simply not a pack.
class PackManifestFileTest : public TempFolderTest {};

TEST_F(PackManifestFileTest, AFifoNamedManifestIsRefusedWithoutWaiting) {
  make_temp_folder("pack_manifest_fifo");
  auto none = read_pack_manifest(dir_.string());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().has_value());
  ASSERT_EQ(::mkfifo((dir_ / std::string(kPackManifestName)).c_str(), 0644), 0);
  auto fifo = read_pack_manifest(dir_.string());
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(std::string(fifo.error().what()).find("not a regular file"), std::string::npos)
      << fifo.error().what();
}

}  // namespace
}  // namespace draftfeed
