// The cache store: the lock protocol (against a writer process holding flock), atomic adoption
// (rename and the cross-file-system copy), and confinement of every delete/move to the allowed
// folders, through `..` and symbolic links.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/hidden/safetensors_writer.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class HiddenCacheStoreTest : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("hidden_store", {"cache", "server", "elsewhere"}); }

  CacheStoreOptions options() const {
    CacheStoreOptions o;
    o.root = (dir_ / "cache").string();
    o.allowed_folders = {(dir_ / "server").string()};
    o.lock_timeout = 2s;
    o.lock_poll = 10ms;
    return o;
  }

  // A valid sample file of `tokens` tokens with token ids 100, 101, ...
  static void write_sample(const std::string& path, std::int64_t tokens) {
    std::vector<std::int64_t> ids(static_cast<std::size_t>(tokens));
    for (std::int64_t i = 0; i < tokens; ++i) ids[static_cast<std::size_t>(i)] = 100 + i;
    const std::vector<std::uint16_t> hidden(static_cast<std::size_t>(tokens * 2 * 3), 0x3F80);
    write_sample_file(path, ids, DType::kBF16, 2, 3, hidden);
  }
};

// A child process that creates `lock`, holds flock(LOCK_EX) on it for `hold`, writes the data file
// slowly in between (first a truncated part, then the rest), and exits. Returns its pid once the
// lock is held.
pid_t spawn_writer(const std::string& data, const std::string& lock,
                   std::chrono::milliseconds hold) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(3);
    // A partial file under the final name while the lock is held: readers must not see it.
    { std::ofstream(data, std::ios::binary) << "partial"; }
    if (::write(ready[1], "x", 1) != 1) ::_exit(4);
    std::this_thread::sleep_for(hold);
    try {
      const std::vector<std::int64_t> ids = {100, 101};
      const std::vector<std::uint16_t> hidden(2 * 2 * 3, 0x3F80);
      const std::vector<TensorToWrite> tensors = {
          {"token_ids", DType::kI64, {2}, {reinterpret_cast<const std::uint8_t*>(ids.data()), 16}},
          {"hidden_states",
           DType::kBF16,
           {2, 2, 3},
           {reinterpret_cast<const std::uint8_t*>(hidden.data()), hidden.size() * 2}},
      };
      write_safetensors(data, tensors, nullptr, {.atomic = false});
    } catch (...) {
      ::_exit(5);
    }
    ::_exit(0);  // the lock is released when the process ends
  }
  ::close(ready[1]);
  char byte;
  const bool ok = ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  return ok ? pid : -1;
}

int wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(HiddenCacheStoreTest, MissingFileIsNothing) {
  const CacheStore store(options());
  auto found = store.lookup(7);
  ASSERT_TRUE(found.ok()) << found.error().what();
  EXPECT_FALSE(found.value().has_value());
  EXPECT_EQ(store.path_for(7), (dir_ / "cache" / "hs_7.safetensors").string());
}

TEST_F(HiddenCacheStoreTest, LookupReturnsBothViews) {
  const CacheStore store(options());
  write_sample(store.path_for(3), 4);
  auto found = store.lookup(3);
  ASSERT_TRUE(found.ok()) << found.error().what();
  ASSERT_TRUE(found.value().has_value());
  const HiddenStateSample& sample = *found.value();
  EXPECT_EQ(sample.token_ids.shape, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(sample.hidden_states.shape, (std::vector<std::int64_t>{4, 2, 3}));
  EXPECT_EQ(sample.path(), store.path_for(3));
}

TEST_F(HiddenCacheStoreTest, FileWithoutAKeyIsAFormatError) {
  const CacheStore store(options());
  const std::vector<std::uint8_t> one(1);
  const std::vector<TensorToWrite> tensors = {{"other", DType::kU8, {1}, one}};
  write_safetensors(store.path_for(1), tensors);
  auto found = store.lookup(1);
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().kind(), ErrorKind::kFormat);
  EXPECT_CONTAINS(found.error().what(),
                  "hs_1.safetensors: no tensor `token_ids` and `hidden_states` (it holds `other`)");
}

TEST_F(HiddenCacheStoreTest, WaitsForTheWriterProcessThenReadsTheCompleteFile) {
  const CacheStore store(options());
  const std::string data = store.path_for(5);
  const pid_t writer = spawn_writer(data, data + ".lock", 300ms);
  ASSERT_GT(writer, 0);
  const auto start = std::chrono::steady_clock::now();
  auto found = store.lookup(5);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(wait_child(writer), 0);
  ASSERT_TRUE(found.ok()) << found.error().what();
  ASSERT_TRUE(found.value().has_value());
  EXPECT_EQ(found.value()->token_ids.shape[0], 2);
  EXPECT_GE(waited, 200ms);
  EXPECT_FALSE(fs::exists(data + ".lock")) << "the reader removes the lock file";
}

TEST_F(HiddenCacheStoreTest, LockHeldPastTheTimeoutIsATimeoutNamingTheLock) {
  auto o = options();
  o.lock_timeout = 200ms;
  const CacheStore store(o);
  const std::string data = store.path_for(6);
  const pid_t writer = spawn_writer(data, data + ".lock", 1500ms);
  ASSERT_GT(writer, 0);
  const auto start = std::chrono::steady_clock::now();
  auto found = store.lookup(6);
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().kind(), ErrorKind::kTimeout);
  EXPECT_CONTAINS(found.error().what(),
                  data + ".lock: timed out after 0.2 s waiting for the writer's lock");
  // A timeout while the writer still holds the lock (1.5 s): it did not wait for the writer. That
  // it comes at the deadline is AHeldLockIsAskedForSoonThenLessAndLessOften's.
  EXPECT_GE(waited, 200ms);
  EXPECT_TRUE(fs::exists(data + ".lock")) << "a lock we never got is not removed";
  EXPECT_EQ(wait_child(writer), 0);
}

// No inotify on a network file system: a held lock is asked for again, soon at first (a writer
// about to finish is noticed within a fraction of the longest interval), then less and less often
// (at most `poll` apart), and the timeout is reported at the deadline, not an interval later. The
// intervals themselves are PollBackoffTest's; here the margins are wide (seconds against what a
// loaded machine adds), so the long intervals are long.
TEST_F(HiddenCacheStoreTest, AHeldLockIsAskedForSoonThenLessAndLessOften) {
  const std::string lock = (dir_ / "cache" / "hs_1.safetensors.lock").string();
  { std::ofstream(lock).put('x'); }
  // Another open file description of the lock: flock conflicts with it as with another process.
  const int holder = ::open(lock.c_str(), O_RDWR);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(::flock(holder, LOCK_EX), 0);
  std::atomic<std::int64_t> released_ns{0};
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    released_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    ::flock(holder, LOCK_UN);
  });
  // At most 64 s apart: the first attempts 1 s, 2 s, 4 s ... apart. Released after 20 ms: noticed
  // at the first or second of them, where a fixed poll would notice it 64 s later.
  const auto error = wait_for_lock(lock, 120s, 64s, LockMode::kWait);
  const auto noticed = std::chrono::steady_clock::now().time_since_epoch();
  writer.join();
  ::close(holder);
  ASSERT_FALSE(error.has_value()) << error->what();
  const auto late = noticed - std::chrono::steady_clock::duration(released_ns.load());
  EXPECT_LT(late, 10s) << "noticed " << std::chrono::duration<double>(late).count() << " s late";

  // Held for the whole timeout (0.6 s) with attempts at most 100 ms apart: 1.5, 3, 6, 12, 25,
  // 50 ms, then every 100 ms: 13 attempts at most, not hundreds (a loaded machine only makes the
  // sleeps longer, so fewer), and more than one.
  { std::ofstream(lock).put('x'); }
  const int held = ::open(lock.c_str(), O_RDWR);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  std::int64_t attempts = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto timeout = wait_for_lock(lock, 600ms, 100ms, LockMode::kWait, &attempts);
  ASSERT_TRUE(timeout.has_value());
  EXPECT_EQ(timeout->kind(), ErrorKind::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 600ms);
  EXPECT_LE(attempts, 14);  // 13, and one for rounding
  EXPECT_GE(attempts, 2);

  // A timeout of 0.3 s where the first interval is 30 s (a ceiling of 1920 s): that wait is cut at
  // the deadline, not slept whole; and no attempt after it.
  attempts = 0;
  const auto cut_start = std::chrono::steady_clock::now();
  const auto cut = wait_for_lock(lock, 300ms, 1920s, LockMode::kWait, &attempts);
  const auto waited = std::chrono::steady_clock::now() - cut_start;
  ::close(held);
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->kind(), ErrorKind::kTimeout);
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 10s) << "the timeout came an interval (30 s) late";
  EXPECT_LE(attempts, 2);
}

TEST_F(HiddenCacheStoreTest, StaleLockWithoutAHolderIsRemoved) {
  const CacheStore store(options());
  write_sample(store.path_for(2), 3);
  { std::ofstream(store.path_for(2) + ".lock"); }
  auto found = store.lookup(2);
  ASSERT_TRUE(found.ok()) << found.error().what();
  EXPECT_TRUE(found.value().has_value());
  EXPECT_FALSE(fs::exists(store.path_for(2) + ".lock"));
}

TEST_F(HiddenCacheStoreTest, StaleLockWithoutADataFileIsMissing) {
  const CacheStore store(options());
  { std::ofstream(store.path_for(4) + ".lock"); }
  auto found = store.lookup(4);
  ASSERT_TRUE(found.ok()) << found.error().what();
  EXPECT_FALSE(found.value().has_value());
  EXPECT_FALSE(fs::exists(store.path_for(4) + ".lock"));
}

TEST_F(HiddenCacheStoreTest, ProbeModeNeitherWaitsNorRemoves) {
  auto o = options();
  o.lock_mode = LockMode::kProbe;
  o.lock_timeout = 5s;
  const CacheStore store(o);
  const std::string data = store.path_for(8);
  const pid_t writer = spawn_writer(data, data + ".lock", 800ms);
  ASSERT_GT(writer, 0);
  // Not waited for: a probe that waited (up to 5 s) would have read the file once the writer let
  // go (0.8 s), not reported the lock.
  auto found = store.lookup(8);
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().kind(), ErrorKind::kTimeout);
  EXPECT_CONTAINS(found.error().what(), "locked by a writer");
  EXPECT_TRUE(fs::exists(data + ".lock"));
  EXPECT_EQ(wait_child(writer), 0);
  // The writer is gone: the lock is stale; a probe reads the file and leaves the lock file.
  auto after = store.lookup(8);
  ASSERT_TRUE(after.ok()) << after.error().what();
  EXPECT_TRUE(after.value().has_value());
  EXPECT_TRUE(fs::exists(data + ".lock"));
}

TEST_F(HiddenCacheStoreTest, ConcurrentLookupsOfOneLockedFileAllSucceed) {
  const CacheStore store(options());
  const std::string data = store.path_for(9);
  const pid_t writer = spawn_writer(data, data + ".lock", 200ms);
  ASSERT_GT(writer, 0);
  std::vector<std::thread> readers;
  std::atomic<int> good{0};
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      auto found = store.lookup(9);
      if (found.ok() && found.value().has_value() && found.value()->token_ids.shape[0] == 2) ++good;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(wait_child(writer), 0);
  EXPECT_EQ(good.load(), 4);
}

TEST_F(HiddenCacheStoreTest, AdoptRenamesIntoTheRootCreatingIt) {
  auto o = options();
  o.root = (dir_ / "cache" / "new" / "root").string();
  const CacheStore store(o);
  const std::string source = (dir_ / "server" / "gen_1.safetensors").string();
  write_sample(source, 3);
  store.adopt(11, source);
  EXPECT_FALSE(fs::exists(source));
  auto found = store.lookup(11);
  ASSERT_TRUE(found.ok() && found.value().has_value());
  EXPECT_EQ(found.value()->token_ids.shape[0], 3);
}

TEST_F(HiddenCacheStoreTest, AdoptAcrossFileSystemsCopiesSyncsAndRenames) {
  auto o = options();
  o.force_copy_on_adopt = true;
  const CacheStore store(o);
  const std::string source = (dir_ / "server" / "gen_2.safetensors").string();
  write_sample(source, 5);
  write_sample(store.path_for(12), 1);  // an older file is replaced
  store.adopt(12, source);
  EXPECT_FALSE(fs::exists(source));
  auto found = store.lookup(12);
  ASSERT_TRUE(found.ok() && found.value().has_value());
  EXPECT_EQ(found.value()->token_ids.shape[0], 5);
  for (const auto& entry : fs::directory_iterator(dir_ / "cache")) {
    EXPECT_EQ(entry.path().filename().string().rfind(".hs_", 0), std::string::npos)
        << "temporary left behind: " << entry.path();
  }
}

TEST_F(HiddenCacheStoreTest, AdoptOfAMissingSourceIsNotFound) {
  const CacheStore store(options());
  try {
    store.adopt(1, (dir_ / "server" / "nope.safetensors").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

TEST_F(HiddenCacheStoreTest, PathsOutsideTheAllowedFoldersAreRefused) {
  const CacheStore store(options());
  const std::string outside = (dir_ / "elsewhere" / "victim.safetensors").string();
  write_sample(outside, 2);
  const std::string dotdot = (dir_ / "server" / ".." / "elsewhere" / "victim.safetensors").string();
  fs::create_symlink(dir_ / "elsewhere", dir_ / "server" / "link_dir");
  fs::create_symlink(outside, dir_ / "server" / "link_file.safetensors");
  const std::string through_dir = (dir_ / "server" / "link_dir" / "victim.safetensors").string();
  const std::string through_file = (dir_ / "server" / "link_file.safetensors").string();
  // A prefix of an allowed folder's name is not inside it.
  fs::create_directories(dir_ / "server2");
  const std::string sibling = (dir_ / "server2" / "x.safetensors").string();
  write_sample(sibling, 1);

  for (const auto& path : {outside, dotdot, through_dir, through_file, sibling}) {
    for (int op = 0; op < 3; ++op) {
      try {
        if (op == 0) store.adopt(1, path);
        if (op == 1) store.remove(path);
        if (op == 2) (void)store.load(path).value();
        FAIL() << "op " << op << " accepted " << path;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
        EXPECT_CONTAINS(e.what(), path + " resolves to ");
        EXPECT_CONTAINS(e.what(), "outside the folders this store may change");
      }
    }
  }
  EXPECT_TRUE(fs::exists(outside));
  EXPECT_TRUE(fs::exists(sibling));
  // The folders themselves are not "inside" them.
  EXPECT_FALSE(store.confine((dir_ / "server").string()).ok());
  EXPECT_FALSE(store.confine((dir_ / "cache/").string()).ok());
  // Inside, through `..` that stays inside, is fine.
  const std::string inside = (dir_ / "server" / "sub" / ".." / "ok.safetensors").string();
  auto confined = store.confine(inside);
  ASSERT_TRUE(confined.ok()) << confined.error().what();
  EXPECT_EQ(confined.value(), (dir_ / "server" / "ok.safetensors").string());
}

TEST_F(HiddenCacheStoreTest, RemoveAndLoadWorkInsideTheAllowedFolders) {
  const CacheStore store(options());
  const std::string generated = (dir_ / "server" / "gen.safetensors").string();
  write_sample(generated, 2);
  auto loaded = store.load(generated);
  ASSERT_TRUE(loaded.ok()) << loaded.error().what();
  ASSERT_TRUE(loaded.value().has_value());
  store.remove(generated);
  EXPECT_FALSE(fs::exists(generated));
  store.remove(generated);  // already gone: fine
}

// draftfeed's sharded layout: <root>/<row // 1000, 4 digits>/hs_<row>.safetensors.
TEST_F(HiddenCacheStoreTest, ShardedPathsFollowTheRowDividedByAThousand) {
  const std::string root = (dir_ / "cache").string();
  EXPECT_EQ(cache_file_path(root, 7, CacheLayout::kSharded), root + "/0000/hs_7.safetensors");
  EXPECT_EQ(cache_file_path(root, 12345, CacheLayout::kSharded),
            root + "/0012/hs_12345.safetensors");
  EXPECT_EQ(cache_file_path(root, 12345678, CacheLayout::kSharded),
            root + "/12345/hs_12345678.safetensors");
  EXPECT_EQ(cache_file_path(root, 999, CacheLayout::kFlat), root + "/hs_999.safetensors");
  EXPECT_TRUE(is_shard_folder_name("0012"));
  EXPECT_TRUE(is_shard_folder_name("12345"));
  EXPECT_FALSE(is_shard_folder_name("012"));
  EXPECT_FALSE(is_shard_folder_name("00a1"));
  EXPECT_THROW(parse_cache_layout("nested"), Error);
}

TEST_F(HiddenCacheStoreTest, LookupFindsEachFileInEitherLayout) {
  const CacheStore store(options());  // writes flat; reads both
  auto sharded = options();
  sharded.layout = CacheLayout::kSharded;
  const CacheStore sharded_store(sharded);
  write_sample(store.path_for(3), 3);
  write_sample(sharded_store.path_for_writing(1003), 4);
  write_sample(store.path_for(5), 5);
  for (int pass = 0; pass < 2; ++pass) {  // whichever layout the previous file was found in
    for (const auto& [row, tokens, path] : std::vector<std::tuple<int, int, std::string>>{
             {3, 3, (dir_ / "cache" / "hs_3.safetensors").string()},
             {1003, 4, (dir_ / "cache" / "0001" / "hs_1003.safetensors").string()},
             {5, 5, (dir_ / "cache" / "hs_5.safetensors").string()}}) {
      for (const CacheStore* reader : {&store, &sharded_store}) {
        auto found = reader->lookup(row);
        ASSERT_TRUE(found.ok()) << found.error().what();
        ASSERT_TRUE(found.value().has_value()) << row;
        EXPECT_EQ(found.value()->token_ids.shape[0], tokens);
        EXPECT_EQ(found.value()->file->path(), path);
      }
    }
  }
  auto missing = sharded_store.lookup(4);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing.value().has_value());
  EXPECT_EQ(store.paths_text(4), (dir_ / "cache" / "hs_4.safetensors").string() + " (or " +
                                     (dir_ / "cache" / "0000" / "hs_4.safetensors").string() + ")");
}

TEST_F(HiddenCacheStoreTest, AdoptIntoTheShardedLayoutReplacesTheFlatFile) {
  auto o = options();
  o.layout = CacheLayout::kSharded;
  const CacheStore store(o);
  write_sample((dir_ / "cache" / "hs_2001.safetensors").string(), 2);  // an older flat file
  const std::string source = (dir_ / "server" / "gen.safetensors").string();
  write_sample(source, 6);
  store.adopt(2001, source);
  EXPECT_TRUE(fs::exists(dir_ / "cache" / "0002" / "hs_2001.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "cache" / "hs_2001.safetensors"));
  auto found = store.lookup(2001);
  ASSERT_TRUE(found.ok() && found.value().has_value());
  EXPECT_EQ(found.value()->token_ids.shape[0], 6);
  // A copy a killed process left in a shard folder is found and removed there too.
  const std::string stale = (dir_ / "cache" / "0002" / ".hs_2002.safetensors.adopt-").string() +
                            [] {
                              char name[256] = {};
                              ::gethostname(name, sizeof(name) - 1);
                              return std::string(name);
                            }() +
                            "-999999999-0";
  { std::ofstream(stale).put('x'); }
  EXPECT_EQ(store.remove_stale_temporaries(), 1);
  EXPECT_FALSE(fs::exists(stale));
}

}  // namespace
}  // namespace draftfeed
