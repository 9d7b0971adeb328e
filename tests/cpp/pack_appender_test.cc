// Keeping generated rows in a pack within a budget (pack/pack_appender.h): what is offered is
// encoded and committed under the writer lock; the budget holds across appenders; rows another
// writer kept are not kept twice; a commit that cannot get the lock drops its shard and writes
// nothing; sizes parse as the command line and Python give them.
#include "draftfeed/pack/pack_appender.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "draftfeed/common/folder_lock.h"
#include "draftfeed/hidden/validate.h"
#include "draftfeed/pack/packed_cache.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr std::int64_t kTokens = 6;
constexpr std::int64_t kLayers = 2;
constexpr std::int64_t kHidden = 64;

class PackAppenderTest : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("pack_appender", {"cache", "server"}); }
  std::string root() const { return (dir_ / "cache").string(); }
  // A generated file of `row` (in the server's folder), opened.
  std::shared_ptr<const SafetensorsFile> generated(int row) {
    ids_.resize(std::max<std::size_t>(ids_.size(), static_cast<std::size_t>(row) + 1));
    ids_[static_cast<std::size_t>(row)] = std::vector<std::int64_t>(kTokens, 10 + row);
    std::vector<std::uint16_t> hidden(kTokens * kLayers * kHidden);
    for (std::size_t i = 0; i < hidden.size(); ++i) {
      hidden[i] =
          static_cast<std::uint16_t>(0x3F00U + ((i * 13 + static_cast<std::size_t>(row)) & 0xFFU));
    }
    const std::string path = (dir_ / "server" / ("r" + std::to_string(row))).string();
    write_sample_file(path, ids_[static_cast<std::size_t>(row)], DType::kBF16, kLayers, kHidden,
                      hidden);
    return SafetensorsFile::open(path).value();
  }
  PackAppendOptions options(std::uint64_t budget = 0) const {
    PackAppendOptions o;
    o.root = root();
    o.budget_bytes = budget;
    o.shard_bytes = 4096;
    o.lock_wait = std::chrono::milliseconds(0);
    return o;
  }
  std::shared_ptr<const PackedCache> pack() const { return PackedCache::open(root()).value(); }
  std::uint64_t bytes_on_disk() const {
    std::uint64_t bytes = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ / "cache")) {
      if (entry.path().filename() != kWriterLockName) bytes += entry.file_size();
    }
    return bytes;
  }

  std::vector<std::vector<std::int64_t>> ids_;
};

TEST_F(PackAppenderTest, OfferedRowsAreKeptAndReadBack) {
  {
    PackAppender appender(options());
    for (int row = 0; row < 10; ++row) EXPECT_TRUE(appender.offer(row, generated(row)));
    appender.flush();
    const PackAppendStats stats = appender.stats();
    EXPECT_EQ(stats.kept, 10);
    EXPECT_GE(stats.shards, 2);  // 4 KiB shards
    EXPECT_EQ(stats.pack_bytes, bytes_on_disk());
  }
  const auto kept = pack();
  ASSERT_NE(kept, nullptr);
  ASSERT_EQ(kept->manifest().samples.size(), 10u);
  for (int row = 0; row < 10; ++row) {
    auto read = kept->read(*kept->find(row), /*always_check=*/true);
    ASSERT_TRUE(read.ok()) << read.error().what();
    EXPECT_TRUE(
        validate_sample(read.value().sample, RowIds(ids_[static_cast<std::size_t>(row)]), row)
            .ok());
  }
  // No temporary left behind.
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "cache")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

TEST_F(PackAppenderTest, TheBudgetHoldsAcrossTwoAppenders) {
  const std::uint64_t budget = 12000;
  PackAppender first(options(budget));
  PackAppender second(options(budget));
  for (int row = 0; row < 40; ++row) {
    (row % 2 == 0 ? first : second).offer(row, generated(row));
    if (row % 5 == 4) {
      first.flush();
      second.flush();
    }
  }
  first.flush();
  second.flush();
  EXPECT_LE(bytes_on_disk(), budget);
  EXPECT_TRUE(first.full() || second.full());
  const auto kept = pack();
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(static_cast<std::int64_t>(kept->manifest().samples.size()),
            first.stats().kept + second.stats().kept);
  EXPECT_GT(kept->manifest().samples.size(), 0u);
  EXPECT_LT(kept->manifest().samples.size(), 40u);
  EXPECT_EQ(kept->manifest().budget_bytes, budget);
  EXPECT_FALSE(first.offer(100, generated(100)));  // full: refused
}

TEST_F(PackAppenderTest, ARowAnotherWriterKeptIsNotKeptTwice) {
  PackAppender first(options());
  PackAppender second(options());
  for (int row = 0; row < 4; ++row) first.offer(row, generated(row));
  first.flush();
  for (int row = 2; row < 6; ++row) second.offer(row, generated(row));
  second.flush();
  EXPECT_EQ(second.stats().kept, 2);
  EXPECT_EQ(second.stats().duplicates, 2);
  EXPECT_EQ(pack()->manifest().samples.size(), 6u);
}

TEST_F(PackAppenderTest, ACommitThatCannotGetTheLockDropsItsShard) {
  auto held = FolderLock::acquire(root(), "draftfeed pack", std::chrono::seconds(0));
  ASSERT_TRUE(held.ok());
  PackAppender appender(options());
  for (int row = 0; row < 3; ++row) appender.offer(row, generated(row));
  appender.flush();
  EXPECT_EQ(appender.stats().dropped_lock, 3);
  EXPECT_EQ(appender.stats().kept, 0);
  EXPECT_FALSE(std::filesystem::exists(root() + "/manifest.json"));
  const auto messages = appender.take_messages();
  ASSERT_FALSE(messages.empty());
  EXPECT_NE(messages[0].find("(draftfeed pack, since"), std::string::npos) << messages[0];
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "cache")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

TEST(PackByteSize, SizesParseAndOthersAreRefusedByName) {
  EXPECT_EQ(parse_byte_size("500GB", "--cache-budget"), 500'000'000'000ULL);
  EXPECT_EQ(parse_byte_size("1.5TB", "--cache-budget"), 1'500'000'000'000ULL);
  EXPECT_EQ(parse_byte_size("64MiB", "--cache-budget"), 64ULL << 20);
  EXPECT_EQ(parse_byte_size("2k", "--cache-budget"), 2000ULL);
  EXPECT_EQ(parse_byte_size("12345", "--cache-budget"), 12345ULL);
  for (const char* bad : {"", "GB", "-1GB", "5XB", "1e400", "5 GB", "nan"}) {
    try {
      (void)parse_byte_size(bad, "--cache-budget");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("--cache-budget must be a size"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace draftfeed
