// Reading a file into the page cache leaving all of it there; and the cache's prefetch: files
// opened and read in plan order, as many in flight as the latency needs (not a fixed number of
// threads), within its budgets of bytes and open files, a slow open holding back only its own row,
// rows a fetch reached first left to it, and clear() dropping everything. (Whether the kernel reads
// is the kernel's business; the bookkeeping is checked here, and bench/bench_cold.py and
// bench/bench_netfs.py measure the effect.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/stats_tree.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/read_ahead/file_read_ahead.h"
#include "draftfeed/read_ahead/page_cache_read.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

class ConcurrentCacheReadaheadTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("readahead");
    for (int row = 0; row < 6; ++row) {
      std::ofstream(path(row), std::ios::binary) << std::string(10000, 'x');
    }
  }
  std::string path(int row) const { return (dir_ / ("hs_" + std::to_string(row))).string(); }
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
bool eventually(F done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
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

// Sample files of rows 0..kRows-1 (2 MB each) in a flat cache, opened through the
// store's lookup, counted and, for tests that need it, made slow or held.
class ConcurrentFileReadAheadTest : public TempFolderTest {
 protected:
  static constexpr int kRows = 12;
  void SetUp() override {
    make_temp_folder("prefetch");
    CacheStoreOptions options;
    options.root = dir_.string();
    store_ = std::make_shared<const CacheStore>(options);
    // 2 MB each: larger than the kernel's read-around of the header's page fault, so an evicted
    // file is not cached whole by its open.
    const std::vector<std::uint16_t> hidden(256 * 2 * 2048, 0x3F80);
    for (int row = 0; row < kRows; ++row) {
      std::vector<std::int64_t> ids(256, row);
      write_sample_file(store_->path_for(row), ids, DType::kBF16, 2, 2048, hidden);
    }
    file_bytes_ = std::filesystem::file_size(store_->path_for(0));
  }
  void TearDown() override {
    release();
    TempFolderTest::TearDown();
  }

  // The store's lookup, counted; `held_` rows wait until release(), each `delay_` long.
  FileReadAhead::Opener opener() {
    return [this](std::int64_t row) {
      const int now = ++opening_;
      int seen = max_opening_.load();
      while (now > seen && !max_opening_.compare_exchange_weak(seen, now)) {
      }
      {
        std::unique_lock lock(mutex_);
        opened_.insert(row);
        const bool hold =
            held_.count(row) != 0 && (hold_calls_ == 0 || calls_[row]++ < hold_calls_);
        released_.wait_for(lock, std::chrono::seconds(20), [&] { return !hold || release_all_; });
      }
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      --opening_;
      // As the cache source opens its files (kMapForRowReads: the read-ahead reads through the fd).
      return store_->lookup(row, MapOptions{.keep_descriptor = true, .header_only = true});
    };
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      release_all_ = true;
    }
    released_.notify_all();
  }
  bool was_opened(std::int64_t row) {
    std::lock_guard lock(mutex_);
    return opened_.count(row) != 0;
  }
  // Every row, from the read-ahead or, where it has not opened the row, opened here (as a fetch
  // does).
  void take_or_open_each(FileReadAhead& prefetch) {
    for (int row = 0; row < kRows; ++row) {
      auto taken = prefetch.take(row);
      if (!taken) taken.emplace(opener()(row));
      ASSERT_TRUE(taken->ok() && taken->value().has_value()) << row;
    }
  }
  static FileReadAheadPlan plan_of(std::vector<std::vector<std::int64_t>> batches) {
    auto owner = std::make_shared<std::vector<std::vector<std::int64_t>>>(std::move(batches));
    FileReadAheadPlan plan;
    for (const auto& batch : *owner) plan.batches.emplace_back(batch);
    plan.owner = owner;
    return plan;
  }
  static std::vector<std::vector<std::int64_t>> all_rows() {
    std::vector<std::vector<std::int64_t>> batches(3);
    for (int row = 0; row < kRows; ++row) batches[static_cast<std::size_t>(row / 4)].push_back(row);
    return batches;
  }

  std::shared_ptr<const CacheStore> store_;
  std::uint64_t file_bytes_ = 0;
  std::chrono::milliseconds delay_{0};
  std::atomic<int> opening_{0};
  std::atomic<int> max_opening_{0};
  std::mutex mutex_;
  std::condition_variable released_;
  std::set<std::int64_t> held_;
  int hold_calls_ = 0;  // 0: every open of a held row waits; N: its first N opens
  std::map<std::int64_t, int> calls_;
  std::set<std::int64_t> opened_;
  bool release_all_ = false;
};

TEST_F(ConcurrentFileReadAheadTest, ReadsEveryPlannedFileAheadAndHandsItToItsFetch) {
  for (int row = 0; row < kRows; ++row) {
    if (!evicted(store_->path_for(row), file_bytes_)) GTEST_SKIP() << "the pages stay cached";
  }
  FileReadAhead prefetch(opener());
  prefetch.plan(plan_of(all_rows()));
  // Each file read, unless its open alone brought all of it in (the kernel's read-around of the
  // header's page fault is read_ahead_kb: 8 MB on some disks).
  ASSERT_TRUE(eventually([&] { return prefetch.stats().read + prefetch.stats().cached == kRows; }));
  for (int row = 0; row < kRows; ++row) {
    auto taken = prefetch.take(row);
    ASSERT_TRUE(taken.has_value()) << row;
    ASSERT_TRUE(taken->ok() && taken->value().has_value()) << row;
    EXPECT_EQ(taken->value()->file->path(), store_->path_for(row));
  }
  const FileReadAheadStats stats = prefetch.stats();
  EXPECT_EQ(stats.opened, kRows);  // each file opened once: a take opens nothing again
  EXPECT_EQ(stats.taken, kRows);
  EXPECT_EQ(stats.bytes, static_cast<std::uint64_t>(stats.read) * file_bytes_);
}

TEST_F(ConcurrentFileReadAheadTest, FilesAlreadyCachedAreOpenedNotRead) {
  FileReadAhead prefetch(opener());  // the files were just written: in the page cache
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows; }));
  EXPECT_EQ(prefetch.stats().read, 0);
}

// Little's law: while the fetches wait on opens that keep their threads asleep (600 ms each), the
// prefetch adds threads and keeps the opens in flight by the dozen, not two at a time. (Counted
// where the opens happen, not timed: a loaded machine stretches a run, not the count. The opens
// are long so that they overlap even where a loaded machine, or TSan, starts threads slowly.)
TEST_F(ConcurrentFileReadAheadTest, OpensInFlightFollowTheLatencyNotAThreadCount) {
  delay_ = std::chrono::milliseconds(600);
  FileReadAhead prefetch(opener());
  prefetch.plan(plan_of(all_rows()));
  ASSERT_NO_FATAL_FAILURE(take_or_open_each(prefetch));  // each waits for its open, or opens it
  EXPECT_GE(prefetch.stats().max_opening, 8);
  EXPECT_GE(max_opening_.load(), 8);
  EXPECT_GE(prefetch.stats().threads, 8);
  EXPECT_GT(prefetch.stats().waited, 0);
}

// Where opens are quick and the read-ahead keeps ahead of the fetches, no thread is added: more
// would only contend for the CPUs and the memory map. "Quick" is what the pacer compares with
// (`grow_after`): here a second, far above what a loaded machine or a sanitizer adds to an open of
// a local file (at the default 1 ms a descheduled open counts as slow, and then threads are added
// rightly). Each open takes 20 ms, so both threads are busy while work waits: only the opens'
// speed holds the pacer back. No hedges either: an open a loaded machine stalls may be asked
// again, by a thread of its own (the hedge tests cover that).
TEST_F(ConcurrentFileReadAheadTest, NoThreadIsAddedWhileThePrefetchKeepsAhead) {
  FileReadAheadOptions options;
  options.grow_after = std::chrono::seconds(1);
  options.hedge.factor = 0;
  delay_ = std::chrono::milliseconds(20);
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows; }));
  for (int row = 0; row < kRows; ++row) ASSERT_TRUE(prefetch.take(row).has_value()) << row;
  EXPECT_EQ(prefetch.stats().threads, 2);
  EXPECT_EQ(prefetch.stats().waited, 0);
}

// A file whose open takes seconds (a network file system's tail) holds back its own fetch only:
// the files after it are opened and read meanwhile, and their fetches take them at once.
TEST_F(ConcurrentFileReadAheadTest, ASlowOpenHoldsBackOnlyItsOwnRow) {
  {
    std::lock_guard lock(mutex_);
    held_ = {1};
  }
  FileReadAheadOptions options;
  options.hedge.factor = 0;  // a file stuck for every open: hedging would wait as well
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows - 1; }));
  for (int row = 0; row < kRows; ++row) {
    if (row == 1) continue;
    auto taken = prefetch.take(row);  // never waits: each was prepared
    ASSERT_TRUE(taken.has_value() && taken->ok() && taken->value().has_value()) << row;
  }
  EXPECT_EQ(prefetch.stats().waited, 0);
  std::atomic<bool> done{false};
  std::thread fetch([&] {
    auto taken = prefetch.take(1);
    EXPECT_TRUE(taken.has_value() && taken->ok() && taken->value().has_value());
    done = true;
  });
  ASSERT_TRUE(eventually([&] { return prefetch.stats().waited == 1; }));
  EXPECT_FALSE(done.load());  // its fetch waits for the open under way, not a second open
  release();
  fetch.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(prefetch.stats().opened, kRows);
}

// A fetch waiting for an open far slower than the others asks again itself (a hedged request):
// where the slowness was that one request's, the second answer comes at once.
TEST_F(ConcurrentFileReadAheadTest, AFetchHedgesAnOpenFarSlowerThanTheOthers) {
  {
    std::lock_guard lock(mutex_);
    held_ = {5};
    hold_calls_ = 1;
  }
  FileReadAheadOptions options;
  options.hedge.min_wait = std::chrono::milliseconds(50);
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows - 1; }));
  const auto start = std::chrono::steady_clock::now();
  auto taken = prefetch.take(5);
  const auto waited = std::chrono::steady_clock::now() - start;
  // Hedged: told to open it itself (or, where a loaded machine made the opens look slow, given the
  // prefetch's own second answer); either way not held until the first open's answer.
  if (!taken) taken.emplace(opener()(5));  // the caller's own open: answered at once
  ASSERT_TRUE(taken->ok() && taken->value().has_value());
  EXPECT_LT(waited, std::chrono::seconds(10));  // hang guard: the held open waits 20 s
  EXPECT_GE(prefetch.stats().memory.hedges, 1);
  release();  // the first open's late answer is dropped
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows; }));
  EXPECT_FALSE(prefetch.take(5).has_value());
  for (int row = 6; row < kRows; ++row) ASSERT_TRUE(prefetch.take(row).has_value()) << row;
}

// On a slow file system (opens of 20 ms) an open that takes far longer is asked for again before
// any fetch waits for it: the file is ready when its fetch comes, the late answer dropped.
TEST_F(ConcurrentFileReadAheadTest, ASlowFileSystemsTailIsHedgedAhead) {
  {
    std::lock_guard lock(mutex_);
    held_ = {9};
    hold_calls_ = 1;
  }
  delay_ = std::chrono::milliseconds(20);
  // A tail is 0.5 s or more here, and a waiting fetch asks again after 2 s: an open a loaded
  // machine (or a sanitizer) stretches to 4 x the usual is no tail, nor a hedge's own answer.
  FileReadAheadOptions options;
  options.hedge.min_wait = std::chrono::milliseconds(500);
  options.wanted_hedge.min_wait = std::chrono::seconds(2);
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().memory.hedges == 1; }));
  for (int row = 0; row < kRows; ++row) {
    auto taken = prefetch.take(row);
    ASSERT_TRUE(taken.has_value() && taken->ok() && taken->value().has_value()) << row;
  }
  EXPECT_EQ(prefetch.stats().memory.hedges, 1);  // the fetch of row 9 found it ready
  release();
}

// Asks that meet the tail too (as often as the tail is common: every few epochs of a large cache)
// are asked again, not waited out: the fourth answer comes at once (docs/decisions.md: why four).
TEST_F(ConcurrentFileReadAheadTest, AHedgeThatStallsIsAskedAgain) {
  {
    std::lock_guard lock(mutex_);
    held_ = {5};
    hold_calls_ = 3;  // the first three opens of row 5 wait (20 s, or until released)
  }
  FileReadAhead prefetch(opener());
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows - 1; }));
  const auto start = std::chrono::steady_clock::now();
  auto taken = prefetch.take(5);
  const auto waited = std::chrono::steady_clock::now() - start;
  if (!taken) taken.emplace(opener()(5));  // the caller's own ask
  ASSERT_TRUE(taken->ok() && taken->value().has_value());
  EXPECT_LT(waited, std::chrono::seconds(10))  // hang guard: the held asks wait 20 s
      << "the fetch waited for the stalled asks";
  EXPECT_GE(prefetch.stats().memory.hedges, 3);
  EXPECT_LE(prefetch.stats().memory.hedges, 3);  // four asks in all (max_asks), no more
  // The fourth ask answered first (or the caller's own open: then no ask of the read-ahead did).
  const ReadAheadMemory memory = prefetch.stats().memory;
  EXPECT_EQ(memory.hedges_lost, 0);
  EXPECT_LE(memory.hedges_won, 1);
  release();
}

// Once the fetches reach a batch, a stalled open for it (or for one of the next few batches) is
// asked again at the waiting fetch's sooner delay, before any fetch waits for it (once one waits,
// the tail's time is lost). The pacer's own delay is an hour here: only the batch's nearness can
// hedge.
TEST_F(ConcurrentFileReadAheadTest, StalledOpensOfTheBatchesBeingFetchedAreAskedAgainAhead) {
  {
    std::lock_guard lock(mutex_);
    held_ = {6};  // batch 1
    hold_calls_ = 1;
  }
  FileReadAheadOptions options;
  options.hedge.min_wait = std::chrono::hours(1);
  // Long enough that the second ask (not held) answers within it on a loaded machine: else it is
  // asked a third time, rightly.
  options.wanted_hedge.min_wait = std::chrono::milliseconds(500);
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows - 1; }));
  EXPECT_EQ(prefetch.stats().memory.hedges, 0);
  ASSERT_TRUE(prefetch.take(0).has_value());  // batch 0 is being put together
  ASSERT_TRUE(eventually([&] { return prefetch.stats().memory.hedges == 1; }))
      << "the stalled open for the next batch was not asked again";
  const auto start = std::chrono::steady_clock::now();
  auto taken = prefetch.take(6);
  ASSERT_TRUE(taken.has_value() && taken->ok() && taken->value().has_value());
  // Hang guard: the held open waits 20 s.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(prefetch.stats().memory.hedges, 1);
  // The second ask answered first (the first is held until released): the hedge won.
  EXPECT_EQ(prefetch.stats().memory.hedges_won, 1);
  EXPECT_EQ(prefetch.stats().memory.hedges_lost, 0);
  release();
}

// A file system that turns slow (every open 400 ms, after fast ones) gets opens in flight by the
// dozen within a few rounds: more threads once half of the latest 8 opens were slow, not most of a
// longer history (a plan of 12 files after 12 fast opens would stay on two threads). "Slow" is
// 100 ms here, not 1 ms: a loaded machine makes no local open that slow, so the fast opens add no
// thread.
TEST_F(ConcurrentFileReadAheadTest, ThreadsGrowSoonAfterTheFileSystemTurnsSlow) {
  FileReadAheadOptions options;
  options.hedge.factor = 0;  // every open slow alike: nothing to hedge
  options.grow_after = std::chrono::milliseconds(100);
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == kRows; }));
  for (int row = 0; row < kRows; ++row) ASSERT_TRUE(prefetch.take(row).has_value()) << row;
  ASSERT_EQ(prefetch.stats().threads, 2);
  delay_ = std::chrono::milliseconds(400);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_NO_FATAL_FAILURE(take_or_open_each(prefetch));
  EXPECT_GT(prefetch.stats().threads, 2);
  EXPECT_GT(prefetch.stats().max_opening, 2);
}

// The threads a slow file system's epoch started end once idle (down to two), not kept (up to 256)
// for the rest of the run; and a later plan is served as before.
TEST_F(ConcurrentFileReadAheadTest, IdleThreadsEndDownToTwo) {
  FileReadAheadOptions options;
  options.hedge.factor = 0;
  options.idle_exit_after = std::chrono::milliseconds(200);
  delay_ = std::chrono::milliseconds(100);
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_NO_FATAL_FAILURE(take_or_open_each(prefetch));
  ASSERT_GT(prefetch.stats().threads, 2);
  ASSERT_TRUE(eventually([&] { return prefetch.stats().running == 2; }))
      << "running " << prefetch.stats().running;
  delay_ = std::chrono::milliseconds(0);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_NO_FATAL_FAILURE(take_or_open_each(prefetch));
}

TEST_F(ConcurrentFileReadAheadTest, StaysWithinItsBudgetOfBytesReadAhead) {
  FileReadAheadOptions options;
  options.max_ahead_bytes = 2 * file_bytes_ + file_bytes_ / 2;  // room for two files
  options.skip_cached = false;                                  // read them all, cached or not
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  // Every planned file opened, and read as far as the budget allows: then a third read is due if
  // the budget does not hold.
  ASSERT_TRUE(eventually([&] { return prefetch.settled(); }));
  EXPECT_EQ(prefetch.stats().opened, kRows);
  EXPECT_EQ(prefetch.stats().read, 2);
  // Rows 0 and 1 fetched (the two read, unless an open that came late let a later row's read
  // go first: a fetch reads its file itself when the read-ahead did not): room for more.
  ASSERT_TRUE(prefetch.take(0).has_value());
  ASSERT_TRUE(prefetch.take(1).has_value());
  ASSERT_TRUE(eventually([&] { return prefetch.stats().read >= 3 && prefetch.settled(); }));
  EXPECT_LE(prefetch.stats().read, 4);
  EXPECT_LE(prefetch.stats().memory.peak_bytes, options.max_ahead_bytes);
}

TEST_F(ConcurrentFileReadAheadTest, StaysWithinItsBudgetOfOpenFiles) {
  FileReadAheadOptions options;
  options.max_open_files = 3;
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of(all_rows()));
  ASSERT_TRUE(eventually([&] { return prefetch.settled(); }));  // the fourth open would be due
  EXPECT_EQ(prefetch.stats().opened, 3);
  EXPECT_TRUE(was_opened(2));
  EXPECT_FALSE(was_opened(3));
  // A fetch ahead of the read-ahead opens its row itself; the read-ahead then skips it.
  EXPECT_FALSE(prefetch.take(4).has_value());
  ASSERT_TRUE(prefetch.take(0).has_value());
  ASSERT_TRUE(prefetch.take(1).has_value());
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == 5; }));  // 3, then 5 (4 skipped)
  EXPECT_FALSE(was_opened(4));
  EXPECT_EQ(prefetch.stats().overtaken, 1);
  EXPECT_LE(prefetch.stats().max_open_ahead, 3);
}

TEST_F(ConcurrentFileReadAheadTest, ClearDropsThePlanAndWhatWasPrepared) {
  FileReadAheadOptions options;
  options.max_open_files = 2;
  FileReadAhead prefetch(opener(), options);
  prefetch.plan(plan_of({{0, 1, 2, 3}}));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened == 2; }));
  prefetch.clear();  // an epoch stopped: rows 2 and 3 never come
  EXPECT_FALSE(prefetch.take(0).has_value());
  prefetch.plan(plan_of({{6, 7}}));
  ASSERT_TRUE(eventually([&] { return prefetch.stats().opened >= 4 && prefetch.settled(); }));
  EXPECT_EQ(prefetch.stats().opened, 4);  // 6 and 7, not 2 and 3
  EXPECT_FALSE(was_opened(2));
  EXPECT_TRUE(prefetch.take(7).has_value());
}

// The statistics' one list (for_each_stat): each field once, under its own name, with its value;
// the memory group under its names (byte_budget.h), as the lookahead's.
TEST(CachePrefetchStatsTest, EachFieldIsVisitedOnceUnderItsName) {
  FileReadAheadStats stats;
  stats.opened = 1;
  stats.wait_seconds = 0.5;
  stats.memory.peak_bytes = 7;
  stats.memory.hedges_won = 2;
  const StatsTree tree = stats_tree(stats);
  std::map<std::string, double> seen;
  for_each_stat(stats, [&](const char* name, const auto& value) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>) {
      EXPECT_TRUE(seen.emplace(name, static_cast<double>(value)).second) << name << " twice";
    }
  });
  EXPECT_EQ(seen.size() * 8 + sizeof(ReadAheadMemory), sizeof(FileReadAheadStats));
  EXPECT_EQ(seen["opened"], 1);
  EXPECT_EQ(seen["wait_seconds"], 0.5);
  EXPECT_EQ(seen["read"], 0);
  const StatsTree* memory = tree.group("memory");
  ASSERT_NE(memory, nullptr);
  std::map<std::string, StatsTree::Value> values(memory->values.begin(), memory->values.end());
  EXPECT_EQ(values.size(), 6U);
  EXPECT_EQ(std::get<std::uint64_t>(values.at("peak_bytes")), 7U);
  EXPECT_EQ(std::get<std::int64_t>(values.at("hedges_won")), 2);
}

// A plan brings the loader's budget (byte_budget.h): the limit from then on, reported with the
// bytes held; a plan without one keeps it.
TEST_F(ConcurrentFileReadAheadTest, APlansBudgetIsItsLimitFromThenOn) {
  FileReadAheadOptions options;
  options.skip_cached = false;
  FileReadAhead prefetch(opener(), options);
  EXPECT_EQ(prefetch.stats().memory.limit_bytes, kMinReadAheadBytes);
  FileReadAheadPlan plan = plan_of(all_rows());
  plan.budget_bytes = file_bytes_ + file_bytes_ / 2;  // room for one file
  prefetch.plan(std::move(plan));
  ASSERT_TRUE(eventually([&] { return prefetch.settled(); }));
  const FileReadAheadStats stats = prefetch.stats();
  EXPECT_EQ(stats.memory.limit_bytes, file_bytes_ + file_bytes_ / 2);
  EXPECT_EQ(stats.read, 1);
  EXPECT_EQ(stats.memory.held_bytes, file_bytes_);
  prefetch.clear();
  EXPECT_EQ(prefetch.stats().memory.limit_bytes, file_bytes_ + file_bytes_ / 2);
  EXPECT_EQ(prefetch.stats().memory.held_bytes, 0U);
}

// The read-ahead's options are checked once, the message naming the field.
TEST(CachePrefetchOptionsTest, BadValuesAreRefusedNamingTheField) {
  auto refused = [](const FileReadAheadOptions& options, const char* field) {
    try {
      options.validate();
      ADD_FAILURE() << "accepted; expected an error naming " << field;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
    }
  };
  FileReadAheadOptions o;
  o.validate();
  o.max_threads = 0;
  refused(o, "max_threads");
  o = {};
  o.max_ahead_bytes = 0;
  refused(o, "max_ahead_bytes");
  o = {};
  o.max_open_files = -1;
  refused(o, "max_open_files");
  o = {};
  o.hedge.factor = -1;
  refused(o, "hedge.factor");
  o = {};
  o.max_asks = 0;
  refused(o, "max_asks");
}

}  // namespace
}  // namespace draftfeed
