// The cache source's read-ahead of a packed cache: once an epoch is planned, the planned samples'
// byte ranges (page-aligned) are read into the page cache in plan order through the shard's
// descriptor, as far as the read-ahead's byte budget reaches, and no further: a sample past it
// stays on the disk, though it lies in the same shard, until a fetch takes a sample and frees its
// bytes. Compressed packs alike (the range is the blob).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/hidden/validate.h"
#include "draftfeed/pack/pack_writer.h"
#include "draftfeed/pack/packed_cache.h"
#include "draftfeed/source/cache_source.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

constexpr int kRows = 8;
constexpr std::int64_t kTokens = 256;
constexpr std::size_t kPage = 4096;

// How many pages of bytes [offset, offset + length) of `path` are in the page cache, of how many
// (mincore on a mapping: it starts no I/O).
std::pair<std::size_t, std::size_t> resident_pages(const std::string& path, std::uint64_t offset,
                                                   std::uint64_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return {0, 0};
  const std::uint64_t begin = offset / kPage * kPage;
  const std::size_t size = offset + length - begin;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(begin));
  ::close(fd);
  if (map == MAP_FAILED) return {0, 0};
  std::vector<unsigned char> pages((size + kPage - 1) / kPage);
  std::size_t in = 0;
  if (::mincore(map, size, pages.data()) == 0) {
    in = static_cast<std::size_t>(
        std::count_if(pages.begin(), pages.end(), [](unsigned char p) { return (p & 1) != 0; }));
  }
  ::munmap(map, size);
  return {in, pages.size()};
}

// Drops `path` from the page cache; whether it went (some file systems keep the pages).
bool evicted(const std::string& path, std::uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return resident_pages(path, 0, size).first == 0;
}

// Waits (bounded) until the source's read-ahead has done all its budgets allow.
bool settled(const CacheSampleSource& source) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!source.read_ahead_settled()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

class PackedReadAheadTest : public TempFolderTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    make_temp_folder("packed_read_ahead", {"flat", "pack"});
    CacheStoreOptions flat;
    flat.root = (dir_ / "flat").string();
    flat.lock_mode = LockMode::kProbe;
    const CacheStore source(flat);
    // bf16 values of varied bits (2 MiB a sample), so that a compressed sample spans many pages.
    std::uint32_t state = 12345;
    for (int row = 0; row < kRows; ++row) {
      ids_.emplace_back(kTokens, row);
      std::vector<std::uint16_t> hidden(kTokens * 2 * 2048);
      for (std::uint16_t& value : hidden) {
        state = state * 1664525U + 1013904223U;
        value = static_cast<std::uint16_t>(0x3C00U | ((state >> 16) & 0x07FFU));
      }
      write_sample_file(source.path_for(row), ids_.back(), DType::kBF16, 2, 2048, hidden);
    }
    PackOptions pack;
    pack.rewrite.target_root = (dir_ / "pack").string();
    pack.compress = GetParam();
    pack.rewrite.threads = 1;
    const PackReport report = pack_cache(
        source, 0, kRows,
        [this](std::int64_t row) { return RowIds(ids_[static_cast<std::size_t>(row)]); }, pack);
    ASSERT_EQ(report.packed, kRows);
    auto packed = PackedCache::open(pack.rewrite.target_root);
    ASSERT_TRUE(packed.ok() && packed.value());
    pack_ = packed.value();
    ASSERT_EQ(pack_->manifest().shards.size(), 1u);  // every sample in one shard
    shard_ = pack.rewrite.target_root + "/" + pack_->manifest().shards[0].file;
  }

  const PackEntry& entry(int row) const { return *pack_->find(row); }
  // Pages of `row`'s sample in the page cache, of how many.
  std::pair<std::size_t, std::size_t> resident(int row) const {
    return resident_pages(shard_, entry(row).offset, entry(row).length);
  }
  IntArrayView ids(int row) const {
    const auto& ids = ids_[static_cast<std::size_t>(row)];
    return IntArrayView{reinterpret_cast<const std::uint8_t*>(ids.data()),
                        static_cast<std::int64_t>(ids.size()), 8, true};
  }

  std::vector<std::vector<std::int64_t>> ids_;
  std::shared_ptr<const PackedCache> pack_;
  std::string shard_;
};

TEST_P(PackedReadAheadTest, PlannedSamplesAreReadAheadByRangeWithinTheBudget) {
  if (!evicted(shard_, pack_->manifest().shards[0].bytes)) {
    GTEST_SKIP() << "this file system keeps the pages after POSIX_FADV_DONTNEED";
  }
  // Rows 0, 2 and 4 fit the budget of bytes read ahead, row 6 (the next planned) does not; rows
  // 1, 3, 5 and 7 are not planned (their neighbours' reads may reach into their edges).
  std::uint64_t largest = 0;
  for (int row = 0; row < kRows; ++row) largest = std::max(largest, entry(row).length);
  FileReadAheadOptions budgets;
  budgets.max_ahead_bytes = 3 * (largest + 2 * kPage);
  budgets.max_reading_bytes = largest + 2 * kPage;
  CacheSourceOptions options;
  options.hidden_states_path = (dir_ / "pack").string();
  CacheSampleSource source(std::make_shared<const CacheStore>(options.store()), options, budgets);

  auto batches = std::make_shared<std::vector<PlannedBatch>>();
  batches->push_back(PlannedBatch{0, {0, 2}});
  batches->push_back(PlannedBatch{1, {4, 6}});
  ReadAheadPlan plan;
  plan.batches = batches;
  source.will_need(plan);
  ASSERT_TRUE(settled(source));

  for (const int row : {0, 2, 4}) {
    const auto [in, pages] = resident(row);
    EXPECT_EQ(in, pages) << "row " << row << ": read ahead whole";
  }
  EXPECT_EQ(resident(6).first, 0u) << "row 6 lies past the budget: not read";
  FileReadAheadStats stats = source.read_ahead_stats();
  EXPECT_EQ(stats.ranges, 3);
  EXPECT_EQ(stats.ranges_cached, 0);
  EXPECT_EQ(stats.opened, 0);  // no per-sample file looked for
  EXPECT_GE(stats.bytes, entry(0).length + entry(2).length + entry(4).length);
  EXPECT_LE(stats.memory.peak_bytes, budgets.max_ahead_bytes);

  // A fetch takes row 0: its bytes leave the budget, and row 6 is read ahead.
  ASSERT_TRUE(source.fetch(0, ids(0)).sample.has_value());
  ASSERT_TRUE(settled(source));
  const auto [in, pages] = resident(6);
  EXPECT_EQ(in, pages) << "row 6: read once the budget had room";
  stats = source.read_ahead_stats();
  EXPECT_EQ(stats.ranges, 4);
  EXPECT_EQ(stats.taken, 1);
  for (const int row : {2, 4, 6}) EXPECT_TRUE(source.fetch(row, ids(row)).sample.has_value());
}

TEST_P(PackedReadAheadTest, CachedRangesAreNotReadAgain) {
  // Just written: the shard is in the page cache.
  if (resident_pages(shard_, 0, pack_->manifest().shards[0].bytes).first == 0) {
    GTEST_SKIP() << "the written shard is not in the page cache";
  }
  CacheSourceOptions options;
  options.hidden_states_path = (dir_ / "pack").string();
  CacheSampleSource source(options);
  auto batches = std::make_shared<std::vector<PlannedBatch>>();
  batches->push_back(PlannedBatch{0, {1, 3}});
  ReadAheadPlan plan;
  plan.batches = batches;
  source.will_need(plan);
  ASSERT_TRUE(settled(source));
  const FileReadAheadStats stats = source.read_ahead_stats();
  EXPECT_EQ(stats.ranges, 0);
  EXPECT_EQ(stats.ranges_cached, 2);
  EXPECT_EQ(stats.bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Codec, PackedReadAheadTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "compressed" : "plain"; });

}  // namespace
}  // namespace draftfeed
