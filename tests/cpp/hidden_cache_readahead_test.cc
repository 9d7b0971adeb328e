// The cache's readahead queue: files read in the order given, never more than max_ahead_bytes
// ahead of the fetches, rows a fetch reached first skipped, and clear() dropping everything; and
// reading a file into the page cache leaving all of it there.
// (Whether the kernel reads is the kernel's business; the queue's bookkeeping is checked here,
// and bench/bench_cold.py measures the effect.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/file_readahead.h"
#include "draftfeed/hidden/cache_readahead.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

class ConcurrentCacheReadaheadTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("readahead");
    for (int row = 0; row < 6; ++row) {
      std::ofstream(path(row), std::ios::binary) << std::string(10000, 'x');
    }
  }
  std::string path(int row) const { return (dir_ / ("hs_" + std::to_string(row))).string(); }
  std::vector<std::pair<std::int64_t, std::string>> rows(std::initializer_list<int> ids) const {
    std::vector<std::pair<std::int64_t, std::string>> out;
    for (const int id : ids) out.emplace_back(id, path(id));
    return out;
  }
};

// Drops `path` from the page cache and says whether it went (mincore on a mapping, which unlike a
// read, even a non-blocking one, starts no I/O): some file systems keep the pages.
bool evicted(const std::string& path, std::size_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return false;
  std::vector<unsigned char> pages((size + 4095) / 4096);
  const bool gone = ::mincore(map, size, pages.data()) == 0 &&
                    std::none_of(pages.begin(), pages.end(), [](unsigned char p) { return p & 1; });
  ::munmap(map, size);
  return gone;
}

// Whether every page of `path` is in the page cache.
bool resident(const std::string& path, std::size_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return false;
  std::vector<unsigned char> pages((size + 4095) / 4096);
  const bool all = ::mincore(map, size, pages.data()) == 0 &&
                   std::all_of(pages.begin(), pages.end(), [](unsigned char p) { return p & 1; });
  ::munmap(map, size);
  return all;
}

// Waits (bounded) until `done` holds.
template <typename F>
bool eventually(F done) {
  for (int i = 0; i < 400; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

TEST_F(ConcurrentCacheReadaheadTest, ReadaheadOfAFileAsksForAllOfItUnlessItIsCached) {
  EXPECT_EQ(readahead_file(path(0), 4096, /*skip_cached=*/false), 10000u);
  EXPECT_EQ(readahead_file((dir_ / "missing").string()), 0u);
  // Just written, so in the page cache: nothing to ask for.
  EXPECT_EQ(readahead_file(path(1), 4096), 0u);
  // Evicted (where the file system can drop its pages): asked for again. Residency is checked
  // with mincore, which (unlike a read, even a non-blocking one) starts no I/O.
  const int fd = ::open(path(1).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* map = ::mmap(nullptr, 10000, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  unsigned char pages[3] = {};
  ASSERT_EQ(::mincore(map, 10000, pages), 0);
  ::munmap(map, 10000);
  ::close(fd);
  if ((pages[0] | pages[1] | pages[2]) & 1) {
    GTEST_SKIP() << "this file system keeps the pages after POSIX_FADV_DONTNEED";
  }
  EXPECT_EQ(readahead_file(path(1), 4096), 10000u);
}

TEST_F(ConcurrentCacheReadaheadTest, ReadingAFileIntoThePageCacheReadsAllOfItUnlessItIsCached) {
  // A file larger than one sendfile step of the kernel's pipe (16 pages), and not page-aligned.
  const std::size_t size = (std::size_t{3} << 20) + 123;
  const std::string big = (dir_ / "big").string();
  std::ofstream(big, std::ios::binary) << std::string(size, 'y');
  EXPECT_EQ(read_file_into_page_cache((dir_ / "missing").string()), 0u);
  EXPECT_EQ(read_file_into_page_cache(big), 0u);  // just written, so in the page cache
  EXPECT_EQ(read_file_into_page_cache(big, kReadaheadChunk, /*skip_cached=*/false), size);
  if (!evicted(big, size)) GTEST_SKIP() << "this file system keeps the pages after DONTNEED";
  // It returns once the file is read: every page is resident then, without waiting further.
  EXPECT_EQ(read_file_into_page_cache(big), size);
  EXPECT_TRUE(resident(big, size));
}

TEST_F(ConcurrentCacheReadaheadTest, AFileWithOnlySomePagesCachedIsReadWhole) {
  // Its last page in the page cache and the rest on the disk (the state a probe that itself
  // started a read of the last page left behind): not taken as cached.
  const std::size_t size = 5 * 4096 + 100;
  const std::string file = (dir_ / "partly").string();
  std::ofstream(file, std::ios::binary) << std::string(size, 'p');
  if (!evicted(file, size)) GTEST_SKIP() << "this file system keeps the pages after DONTNEED";
  const int fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char last = 0;
  ASSERT_EQ(::pread(fd, &last, 1, static_cast<off_t>(size - 1)), 1);
  ::close(fd);
  ASSERT_FALSE(resident(file, size));
  EXPECT_EQ(read_file_into_page_cache(file), size);
  EXPECT_TRUE(resident(file, size));
  EXPECT_EQ(read_file_into_page_cache(file), 0u);  // now wholly cached: skipped
}

TEST_F(ConcurrentCacheReadaheadTest, AStoppedReadStartsNoFurtherStep) {
  const std::size_t size = kReadStep + 5000;
  const std::string big = (dir_ / "big").string();
  std::ofstream(big, std::ios::binary) << std::string(size, 'z');
  const std::atomic<bool> stopped = true;
  EXPECT_EQ(read_file_into_page_cache(big, kReadaheadChunk, /*skip_cached=*/false, &stopped), 0u);
  const std::atomic<bool> going = false;
  EXPECT_EQ(read_file_into_page_cache(big, kReadaheadChunk, /*skip_cached=*/false, &going), size);
}

TEST_F(ConcurrentCacheReadaheadTest, ReadsEveryQueuedFileWithSeveralThreads) {
  for (int row = 0; row < 6; ++row) {
    if (!evicted(path(row), 10000)) GTEST_SKIP() << "this file system keeps the pages";
  }
  CacheReadahead readahead(CacheReadaheadOptions{1 << 20, 4096, /*skip_cached=*/true,
                                                 /*sequential_read=*/true, /*threads=*/3});
  readahead.add(rows({0, 1, 2, 3, 4, 5}));
  ASSERT_TRUE(eventually([&] { return readahead.stats().files == 6; }));
  EXPECT_EQ(readahead.stats().bytes, 60000u);
  for (int row = 0; row < 6; ++row) EXPECT_TRUE(resident(path(row), 10000)) << row;
}

TEST_F(ConcurrentCacheReadaheadTest, StaysWithinItsBudgetAheadOfTheFetches) {
  CacheReadahead readahead(CacheReadaheadOptions{15000, 4096, /*skip_cached=*/false,
                                                 /*sequential_read=*/true, /*threads=*/1});
  readahead.add(rows({0, 1, 2, 3}));
  // 10 KB ahead < 15 KB: a second file; 20 KB ahead: it waits.
  ASSERT_TRUE(eventually([&] { return readahead.stats().files == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(readahead.stats().files, 2);
  readahead.reached(0);  // 10 KB ahead again: the third file
  ASSERT_TRUE(eventually([&] { return readahead.stats().files == 3; }));
  EXPECT_EQ(readahead.stats().bytes, 30000u);
  EXPECT_EQ(readahead.stats().max_ahead, 20000u);
}

TEST_F(ConcurrentCacheReadaheadTest, RowsAFetchReachedFirstAreSkipped) {
  CacheReadahead readahead(CacheReadaheadOptions{15000, 4096, /*skip_cached=*/false,
                                                 /*sequential_read=*/true, /*threads=*/1});
  readahead.reached(1);  // fetched before its readahead
  readahead.add(rows({0, 1, 2}));
  ASSERT_TRUE(eventually([&] { return readahead.stats().files == 2; }));
  const CacheReadaheadStats stats = readahead.stats();
  EXPECT_EQ(stats.overtaken, 1);
  EXPECT_EQ(stats.bytes, 20000u);  // rows 0 and 2
}

TEST_F(ConcurrentCacheReadaheadTest, ClearDropsTheQueueAndTheBudget) {
  CacheReadahead readahead(CacheReadaheadOptions{15000, 4096, /*skip_cached=*/false,
                                                 /*sequential_read=*/true, /*threads=*/1});
  readahead.add(rows({0, 1, 2, 3}));
  ASSERT_TRUE(eventually([&] { return readahead.stats().files == 2; }));
  readahead.clear();  // an epoch stopped: rows 2 and 3 never come
  readahead.add(rows({4, 5}));
  ASSERT_TRUE(eventually([&] { return readahead.stats().files == 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(readahead.stats().files, 4);  // 4 and 5, not 2 and 3
}

}  // namespace
}  // namespace draftfeed
