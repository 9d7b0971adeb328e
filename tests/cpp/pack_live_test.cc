// A pack as a reader sees it while the folder is rewritten (pack/live_packed_cache.h), and the
// writer's rules that keep every row (pack/pack_writer.h): the lock held for the run, a file
// removed only once its packed sample reads back, a row packed again when its sample does not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/hidden/validate.h"
#include "draftfeed/pack/live_packed_cache.h"
#include "draftfeed/pack/pack_writer.h"
#include "draftfeed/pack/shard_layout.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr int kRows = 6;
constexpr std::int64_t kTokens = 5;
constexpr std::int64_t kLayers = 2;
constexpr std::int64_t kHidden = 32;

class PackLiveTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("pack_live", {"cache"});
    for (int row = 0; row < kRows; ++row) {
      ids_.emplace_back(kTokens, 100 + row);
      std::vector<std::uint16_t> hidden(kTokens * kLayers * kHidden);
      for (std::size_t i = 0; i < hidden.size(); ++i) {
        hidden[i] = static_cast<std::uint16_t>(0x3F80U + ((i * 7 + row) & 0x7FU));
      }
      write_sample_file(store().path_for(row), ids_.back(), DType::kBF16, kLayers, kHidden, hidden);
    }
  }
  std::string root() const { return (dir_ / "cache").string(); }
  CacheStore store() const {
    CacheStoreOptions options;
    options.root = root();
    options.lock_mode = LockMode::kProbe;
    return CacheStore(options);
  }
  RowIds ids_of(std::int64_t row) const { return RowIds(ids_[static_cast<std::size_t>(row)]); }
  PackReport pack(std::int64_t begin, std::int64_t end, double lock_wait = 0) const {
    PackOptions options;
    options.rewrite.threads = 2;
    options.rewrite.lock_wait = std::chrono::duration<double>(lock_wait);
    options.shard_bytes = 1;  // a shard per sample
    return pack_cache(
        store(), begin, end, [this](std::int64_t row) { return ids_of(row); }, options);
  }
  std::filesystem::path file(int row) const { return store().path_for(row); }

  std::vector<std::vector<std::int64_t>> ids_;
};

TEST_F(PackLiveTest, ARefreshReadsANewManifestAndBorrowsTheShardsItHasOpen) {
  pack(0, 3);
  LivePackedCache live(root());
  const auto first = live.current();
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(first->manifest().samples.size(), 3u);
  auto opened = first->shard(first->find(1)->shard);
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE(first->read(*first->find(1)).ok());

  EXPECT_EQ(live.refresh().value(), first);  // nothing changed: the same pack, one stat
  EXPECT_EQ(live.reloads(), 0);
  pack(3, kRows);
  const auto second = live.refresh().value();
  ASSERT_NE(second, first);
  EXPECT_EQ(live.reloads(), 1);
  EXPECT_EQ(second->manifest().samples.size(), static_cast<std::size_t>(kRows));
  // The shard the first pack opened is the same file still: lent, not opened again.
  EXPECT_EQ(second->shard(second->find(1)->shard).value(), opened.value());
  for (int row = 0; row < kRows; ++row) {
    auto read = second->read(*second->find(row));
    ASSERT_TRUE(read.ok()) << read.error().what();
    EXPECT_TRUE(validate_sample(read.value().sample, ids_of(row), row).ok());
  }
  // The old pack stays readable for whoever holds it (a running epoch).
  EXPECT_TRUE(first->read(*first->find(2)).ok());
}

TEST_F(PackLiveTest, AnUnpackIsFollowedBackToTheFiles) {
  pack(0, kRows);
  LivePackedCache live(root());
  const auto packed = live.current();
  ASSERT_NE(packed, nullptr);
  const auto opened = packed->shard(packed->find(4)->shard).value();
  const UnpackReport report = unpack_cache(root(), CacheRewriteOptions{});
  ASSERT_TRUE(report.removed_pack);
  EXPECT_EQ(live.refresh().value(), nullptr);
  // The shard is gone from the folder, and its mapping still reads for its holder.
  EXPECT_FALSE(std::filesystem::exists(root() + "/" + packed->manifest().shards[0].file));
  EXPECT_TRUE(packed->read(*packed->find(4)).ok());
  EXPECT_TRUE(std::filesystem::exists(file(4)));
}

TEST_F(PackLiveTest, AManifestThatNoLongerReadsIsAnErrorAndTheOldPackStays) {
  pack(0, kRows);
  LivePackedCache live(root());
  const auto packed = live.current();
  std::ofstream(root() + "/manifest.json.new") << "{not json";
  std::filesystem::rename(root() + "/manifest.json.new", root() + "/manifest.json");
  auto refreshed = live.refresh();
  ASSERT_FALSE(refreshed.ok());
  EXPECT_NE(std::string(refreshed.error().what()).find("changed while this reader ran"),
            std::string::npos)
      << refreshed.error().what();
  EXPECT_EQ(live.current(), packed);
}

TEST_F(PackLiveTest, ALeftoverFileGoesOnlyWhenItsPackedSampleReadsBack) {
  // Row 2's file kept aside and put back beside the pack (a killed run's leftover); row 3's too,
  // with its packed sample corrupted: row 2's file goes, row 3 is packed again from its file.
  const std::string saved2 = (dir_ / "hs_2").string();
  const std::string saved3 = (dir_ / "hs_3").string();
  std::filesystem::copy_file(file(2), saved2);
  std::filesystem::copy_file(file(3), saved3);
  pack(0, kRows);
  std::filesystem::copy_file(saved2, file(2));
  std::filesystem::copy_file(saved3, file(3));
  auto before = PackedCache::open(root()).value();
  const PackEntry entry3 = *before->find(3);
  {
    std::fstream shard(root() + "/" + before->manifest().shards[entry3.shard].file,
                       std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(static_cast<std::streamoff>(entry3.offset + entry3.length - 9));
    shard.put('\x55');
  }
  const PackReport report = pack(0, kRows);
  EXPECT_EQ(report.already_packed, kRows - 1);
  EXPECT_EQ(report.repacked, 1);
  EXPECT_EQ(report.packed, 1);
  EXPECT_EQ(report.removed, 2);
  EXPECT_FALSE(std::filesystem::exists(file(2)));
  EXPECT_FALSE(std::filesystem::exists(file(3)));
  auto after = PackedCache::open(root()).value();
  EXPECT_NE(after->find(3)->shard, entry3.shard);  // named by its new sample only
  for (int row = 0; row < kRows; ++row) {
    auto read = after->read(*after->find(row), /*always_check=*/true);
    ASSERT_TRUE(read.ok()) << row << ": " << read.error().what();
  }
}

TEST_F(PackLiveTest, APackWaitsForTheWriterLockOrIsRefused) {
  auto held = FolderLock::acquire(root(), "a test", std::chrono::seconds(0));
  ASSERT_TRUE(held.ok());
  try {
    pack(0, kRows);
    FAIL() << "packed while another writer held the lock";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(error.what()).find("(a test, since"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(root() + "/manifest.json"));  // nothing written
  std::thread release(
      [lock = std::move(held).value()]() mutable { FolderLock gone = std::move(lock); });
  release.join();
  EXPECT_EQ(pack(0, kRows, 60).packed, kRows);
}

TEST(PackHeaderCheck, PartsAreComparedWithTheSamplesOwnHeader) {
  // Row 0's parts as an index would give them, against its own header.
  const std::string header_json =
      R"({"hidden_states":{"dtype":"BF16","shape":[2,1,4],"data_offsets":[0,16]},)"
      R"("token_ids":{"dtype":"I64","shape":[2],"data_offsets":[16,32]}})";
  std::vector<std::uint8_t> header(8 + header_json.size());
  const std::uint64_t n = header_json.size();
  std::memcpy(header.data(), &n, 8);
  std::memcpy(header.data() + 8, header_json.data(), header_json.size());
  const std::uint64_t file_bytes = 8 + n + 32;
  PackedSampleParts parts;
  PackedPart hidden;
  hidden.name = "hidden_states";
  hidden.dtype = DType::kBF16;
  hidden.shape = {2, 1, 4};
  hidden.decoded_bytes = 16;
  PackedPart ids;
  ids.name = "token_ids";
  ids.dtype = DType::kI64;
  ids.shape = {2};
  ids.decoded_bytes = 16;
  parts.parts = {hidden, ids};
  EXPECT_FALSE(check_parts_against_header(parts, header, file_bytes, "row 0").has_value());
  PackedSampleParts relabelled = parts;
  relabelled.parts[0].dtype = DType::kF16;
  const auto error = check_parts_against_header(relabelled, header, file_bytes, "row 0");
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(std::string(error->what())
                .find("the shard's header says F16 [2, 1, 4], the sample's "
                      "own header BF16 [2, 1, 4]"),
            std::string::npos)
      << error->what();
  PackedSampleParts reshaped = parts;
  reshaped.parts[0].shape = {2, 4, 1};
  EXPECT_TRUE(check_parts_against_header(reshaped, header, file_bytes, "row 0").has_value());
  // A file size the header does not describe (the manifest's file_bytes lying).
  EXPECT_TRUE(check_parts_against_header(parts, header, file_bytes + 1, "row 0").has_value());
  EXPECT_TRUE(check_parts_against_header(parts, header, std::uint64_t{1} << 50, "row 0"));
}

}  // namespace
}  // namespace draftfeed
