// Reading a server's file from a handle: plain paths only, confinement to the server folder (by the
// folder's device and inode, links included), refusing the cache's own files, FIFOs, folders and
// oversized files, the lock protocol, the validation outcomes, and which files may ever be removed
// or moved (a hostile server's attacks: other spellings of a cache file, files older than the
// request, hard links, folders of cache files, files swapped after the read). Listings
// before/after show nothing foreign moved.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/hidden/safetensors_writer.h"
#include "draftfeed/source/generated_file.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const std::vector<std::int64_t> kIdValues = {5, 6, 7};
const RowIds kIds{std::span<const std::int64_t>(kIdValues)};

class OnlineGeneratedFileTest : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("online_file", {"cache", "server", "elsewhere"}); }

  std::string path(const std::string& relative) const { return (dir_ / relative).string(); }

  // A request sent a minute ago: every file the test writes is newer.
  static std::chrono::system_clock::time_point sent() {
    return std::chrono::system_clock::now() - std::chrono::minutes(1);
  }

  GeneratedFile read(bool with_server_dir, const std::string& handle, std::int64_t row = 0,
                     std::chrono::system_clock::time_point when = sent()) const {
    return reader(with_server_dir).read(handle, kIds, row, when);
  }

  std::shared_ptr<const CacheStore> store() const {
    CacheStoreOptions options;
    options.root = path("cache");
    return std::make_shared<const CacheStore>(options);
  }

  GeneratedFileReader reader(bool with_server_dir, std::uint64_t max_bytes = 1 << 20) const {
    GeneratedFileOptions o;
    if (with_server_dir) o.server_dir = path("server");
    o.max_file_bytes = max_bytes;
    o.lock_timeout = 300ms;
    o.lock_poll = 10ms;
    return GeneratedFileReader(store(), o);
  }

  // A sample file for `ids` with hidden states [T, 2, 4] in f32; `bad_value` goes to [0, 1, 0].
  static void write_sample(const std::string& file, const std::vector<std::int64_t>& ids,
                           float bad_value = 0.5f) {
    const auto tokens = static_cast<std::int64_t>(ids.size());
    std::vector<float> hidden(static_cast<std::size_t>(tokens * 2 * 4), 0.25f);
    if (!hidden.empty()) hidden[4] = bad_value;
    write_sample_file(file, ids, DType::kF32, 2, 4, hidden);
  }

  std::set<std::string> listing() const {
    std::set<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      out.insert(entry.path().string());
    }
    return out;
  }
};

TEST_F(OnlineGeneratedFileTest, ReadsAValidFileAndReleasesItWithItsLock) {
  write_sample(path("server/a.safetensors"), kIdValues);
  std::ofstream(path("server/a.safetensors.lock")).close();  // released by its writer
  const GeneratedFile f = read(true, path("server/a.safetensors"), 3);
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_TRUE(f.removable()) << f.keep_reason;
  EXPECT_EQ(f.sample->hidden_states.shape, (std::vector<std::int64_t>{3, 2, 4}));
  EXPECT_TRUE(fs::exists(path("server/a.safetensors.lock"))) << "reading removes nothing";
  EXPECT_FALSE(release_generated(*store(), f, std::nullopt).has_value());
  EXPECT_FALSE(fs::exists(path("server/a.safetensors")));
  EXPECT_FALSE(fs::exists(path("server/a.safetensors.lock"))) << "the reference removes it";
}

TEST_F(OnlineGeneratedFileTest, MovesAValidFileIntoTheCacheByRenameOrCopy) {
  for (const bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "copy" : "rename");
    write_sample(path("server/a.safetensors"), kIdValues);
    const GeneratedFile f = read(true, path("server/a.safetensors"), 5);
    ASSERT_TRUE(f.ok() && f.removable()) << f.message << f.keep_reason;
    CacheStoreOptions options;
    options.root = path("cache");
    options.force_copy_on_adopt = copy;
    EXPECT_FALSE(release_generated(CacheStore(options), f, 5).has_value());
    EXPECT_FALSE(fs::exists(path("server/a.safetensors")));
    EXPECT_TRUE(fs::is_regular_file(path("cache/hs_5.safetensors")));
    fs::remove(path("cache/hs_5.safetensors"));
  }
}

TEST_F(OnlineGeneratedFileTest, RefusesHandlesOutsideTheServerFolder) {
  write_sample(path("elsewhere/x.safetensors"), kIdValues);
  fs::create_symlink(path("elsewhere/x.safetensors"), path("server/link.safetensors"));
  fs::create_directories(path("elsewhere/sub"));
  fs::create_directory_symlink(path("elsewhere/sub"), path("server/linked_folder"));
  write_sample(path("elsewhere/sub/y.safetensors"), kIdValues);
  const auto before = listing();
  for (const std::string& handle :
       {path("server/link.safetensors"), path("elsewhere/x.safetensors"), path("server"),
        path("server/linked_folder/y.safetensors")}) {
    const GeneratedFile f = read(true, handle);
    EXPECT_EQ(f.problem, FileProblem::kOutsideServerDir) << handle << ": " << f.message;
    EXPECT_FALSE(f.removable());
    EXPECT_NE(f.message.find("outside the server folder"), std::string::npos) << f.message;
  }
  EXPECT_EQ(read(true, path("server/../elsewhere/x.safetensors")).problem,
            FileProblem::kNotPlainPath);
  EXPECT_EQ(listing(), before) << "nothing may be created, moved or removed";
}

TEST_F(OnlineGeneratedFileTest, ReadsFilesAnywhereWithoutAServerFolder) {
  write_sample(path("elsewhere/x.safetensors"), kIdValues);
  std::ofstream(path("elsewhere/x.safetensors.lock")).close();
  const auto before = listing();
  const GeneratedFile f = read(false, path("elsewhere/x.safetensors"));
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_TRUE(f.removable()) << "new, one link, in a folder of no cache: the request's output";
  EXPECT_EQ(listing(), before) << "reading removes no lock file";
}

TEST_F(OnlineGeneratedFileTest, WaitsForAForeignWritersLockAndTimesOut) {
  write_sample(path("elsewhere/x.safetensors"), kIdValues);
  const int fd = ::open(path("elsewhere/x.safetensors.lock").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const auto start = std::chrono::steady_clock::now();
  const GeneratedFile f = read(false, path("elsewhere/x.safetensors"));
  EXPECT_EQ(f.problem, FileProblem::kLockTimeout) << f.message;
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  // Released while a reader waits: the reader goes on.
  std::thread release([fd] {
    std::this_thread::sleep_for(100ms);
    ::flock(fd, LOCK_UN);
  });
  const GeneratedFile g = read(false, path("elsewhere/x.safetensors"));
  release.join();
  ::close(fd);
  EXPECT_TRUE(g.ok()) << g.message;
  EXPECT_TRUE(fs::exists(path("elsewhere/x.safetensors.lock")));
}

TEST_F(OnlineGeneratedFileTest, LockHeldTooLongIsALockTimeoutWithTheFileHeldForLater) {
  write_sample(path("server/a.safetensors"), kIdValues);
  const int fd = ::open(path("server/a.safetensors.lock").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const GeneratedFile f = read(true, path("server/a.safetensors"));
  ::close(fd);
  EXPECT_EQ(f.problem, FileProblem::kLockTimeout) << f.message;
  EXPECT_TRUE(f.removable()) << f.keep_reason;
}

TEST_F(OnlineGeneratedFileTest, RefusesTheCachesOwnFiles) {
  write_sample(path("cache/hs_3.safetensors"), kIdValues);
  write_sample(path("cache/.hs_4.safetensors.adopt-1-1"), kIdValues);
  fs::create_directories(path("cache/0003"));
  write_sample(path("cache/0003/hs_3003.safetensors"), kIdValues);
  fs::create_directory_symlink(path("cache"), path("elsewhere/cache_link"));
  const auto before = listing();
  for (const char* name :
       {"cache/hs_3.safetensors", "cache/.hs_4.safetensors.adopt-1-1",
        "cache/0003/hs_3003.safetensors", "elsewhere/cache_link/hs_3.safetensors"}) {
    const GeneratedFile f = read(false, path(name), 9);
    EXPECT_EQ(f.problem, FileProblem::kCacheFile) << name << ": " << f.message;
  }
  EXPECT_EQ(listing(), before);
}

TEST_F(OnlineGeneratedFileTest, OnlyRegularFilesOfBoundedSizeAreOpened) {
  ASSERT_EQ(::mkfifo(path("server/fifo.safetensors").c_str(), 0644), 0);
  fs::create_directories(path("server/folder.safetensors"));
  write_sample(path("server/big.safetensors"), kIdValues);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(read(true, path("server/fifo.safetensors")).problem, FileProblem::kNotRegular);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s)  // hang guard
      << "a FIFO must not block the reader";
  EXPECT_EQ(read(true, path("server/folder.safetensors")).problem, FileProblem::kNotRegular);
  const GeneratedFile big = reader(true, 64).read(path("server/big.safetensors"), kIds, 0, sent());
  EXPECT_EQ(big.problem, FileProblem::kTooLarge);
  EXPECT_NE(big.message.find("limit of 64"), std::string::npos) << big.message;
}

TEST_F(OnlineGeneratedFileTest, ClassifiesBadFiles) {
  EXPECT_EQ(read(true, path("server/none.safetensors")).problem, FileProblem::kMissing);
  std::ofstream(path("server/junk.safetensors")) << "definitely not safetensors";
  EXPECT_EQ(read(true, path("server/junk.safetensors")).problem, FileProblem::kCorrupt);
  write_sample(path("server/other.safetensors"), {5, 6, 8});
  const GeneratedFile mismatch = read(true, path("server/other.safetensors"), 11);
  EXPECT_EQ(mismatch.problem, FileProblem::kTokenMismatch);
  EXPECT_NE(mismatch.message.find("row 11"), std::string::npos) << mismatch.message;
  write_sample(path("server/short.safetensors"), {5, 6});
  EXPECT_EQ(read(true, path("server/short.safetensors")).problem, FileProblem::kTokenMismatch);
  write_sample(path("server/nan.safetensors"), kIdValues, std::nanf(""));
  const GeneratedFile nan = read(true, path("server/nan.safetensors"));
  EXPECT_EQ(nan.problem, FileProblem::kNonFinite);
  EXPECT_TRUE(nan.removable()) << "a failed file inside the server folder may go";
  // The same failure outside any server folder stays.
  write_sample(path("elsewhere/nan.safetensors"), kIdValues, std::nanf(""));
  const GeneratedFile away = read(false, path("elsewhere/nan.safetensors"));
  EXPECT_EQ(away.problem, FileProblem::kNonFinite);
  EXPECT_FALSE(away.removable());
  EXPECT_NE(away.keep_reason.find("no server folder"), std::string::npos) << away.keep_reason;
  write_sample(path("server/inf.safetensors"), kIdValues, INFINITY);
  EXPECT_EQ(read(true, path("server/inf.safetensors")).problem, FileProblem::kNonFinite);
}

// -- a hostile server's handles: what may never be removed or moved --

TEST_F(OnlineGeneratedFileTest, HandlesThatAreNotPlainPathsAreRefusedBeforeAnythingIsOpened) {
  write_sample(path("cache/hs_3.safetensors"), kIdValues);
  write_sample(path("server/a.safetensors"), kIdValues);
  const auto before = listing();
  for (const bool server : {false, true}) {
    for (const std::string& handle :
         {path("cache/hs_3.safetensors/"), path("cache/hs_3.safetensors/."),
          path("cache//hs_3.safetensors"), path("cache/./hs_3.safetensors"),
          path("server/a.safetensors//"), path("server/../cache/hs_3.safetensors"), std::string(),
          path("server/a.safetensors") + std::string(1, '\0') + "x"}) {
      const GeneratedFile f = read(server, handle);
      EXPECT_EQ(f.problem, FileProblem::kNotPlainPath) << handle << ": " << f.message;
      EXPECT_EQ(f.held, nullptr);
      EXPECT_TRUE(release_generated(*store(), f, std::nullopt).has_value());
    }
  }
  EXPECT_EQ(listing(), before) << "nothing may be created, moved or removed";
}

TEST_F(OnlineGeneratedFileTest, AFileOlderThanTheRequestIsReadButNeverRemoved) {
  write_sample(path("elsewhere/old.safetensors"), kIdValues);
  const auto later = std::chrono::system_clock::now() + std::chrono::minutes(5);
  for (const bool server : {false, true}) {
    const std::string handle =
        server ? path("server/old.safetensors") : path("elsewhere/old.safetensors");
    if (server) fs::copy_file(path("elsewhere/old.safetensors"), handle);
    const GeneratedFile f = read(server, handle, 0, later);
    ASSERT_TRUE(f.ok()) << f.message;
    EXPECT_FALSE(f.removable());
    EXPECT_NE(f.keep_reason.find("before the request was sent"), std::string::npos)
        << f.keep_reason;
    EXPECT_TRUE(release_generated(*store(), f, std::nullopt).has_value());
    EXPECT_TRUE(release_generated(*store(), f, 1).has_value());
    EXPECT_TRUE(fs::exists(handle));
  }
  EXPECT_FALSE(fs::exists(path("cache/hs_1.safetensors")));
  // Within the allowed clock skew (30 s by default), a file counts as the request's output.
  const auto just_after = std::chrono::system_clock::now() + std::chrono::seconds(5);
  EXPECT_TRUE(read(false, path("elsewhere/old.safetensors"), 0, just_after).removable());
}

TEST_F(OnlineGeneratedFileTest, AHardLinkedFileIsNeverRemovedNorMoved) {
  write_sample(path("elsewhere/precious.safetensors"), kIdValues);
  fs::create_hard_link(path("elsewhere/precious.safetensors"), path("server/h.safetensors"));
  for (const bool server : {false, true}) {
    const GeneratedFile f = read(server, path("server/h.safetensors"));
    ASSERT_TRUE(f.ok()) << f.message;
    EXPECT_FALSE(f.removable());
    EXPECT_NE(f.keep_reason.find("hard links"), std::string::npos) << f.keep_reason;
    EXPECT_TRUE(release_generated(*store(), f, 2).has_value());
  }
  EXPECT_TRUE(fs::exists(path("server/h.safetensors")));
  EXPECT_TRUE(fs::exists(path("elsewhere/precious.safetensors")));
  EXPECT_FALSE(fs::exists(path("cache/hs_2.safetensors")));
}

TEST_F(OnlineGeneratedFileTest, NothingInTheCacheFolderOrAFolderOfCacheFilesIsRemoved) {
  // Another run's cache (a folder of hs_* files), and a file under this cache that is not a cache
  // file: read, but they stay, even when they fail validation.
  fs::create_directories(path("other_cache"));
  write_sample(path("other_cache/hs_7.safetensors"), kIdValues);
  write_sample(path("other_cache/req.safetensors"), kIdValues);
  fs::create_directories(path("cache/notes"));
  std::ofstream(path("cache/notes/keep.txt")) << "my notes";
  write_sample(path("cache/req.safetensors"), kIdValues);
  const auto before = listing();
  const GeneratedFile other = read(false, path("other_cache/req.safetensors"));
  ASSERT_TRUE(other.ok()) << other.message;
  EXPECT_NE(other.keep_reason.find("cache files"), std::string::npos) << other.keep_reason;
  const GeneratedFile notes = read(false, path("cache/notes/keep.txt"));
  EXPECT_EQ(notes.problem, FileProblem::kCorrupt);
  EXPECT_NE(notes.keep_reason.find("cache folder"), std::string::npos) << notes.keep_reason;
  const GeneratedFile inside = read(false, path("cache/req.safetensors"));
  ASSERT_TRUE(inside.ok()) << inside.message;
  EXPECT_NE(inside.keep_reason.find("cache folder"), std::string::npos) << inside.keep_reason;
  for (const GeneratedFile* f : {&other, &notes, &inside}) {
    EXPECT_TRUE(release_generated(*store(), *f, std::nullopt).has_value());
    EXPECT_TRUE(release_generated(*store(), *f, 4).has_value());
  }
  EXPECT_EQ(listing(), before);
}

TEST_F(OnlineGeneratedFileTest, AFileSwappedAfterTheReadIsLeftAsItIs) {
  write_sample(path("cache/hs_3.safetensors"), kIdValues);
  // Swapped for another regular file, for a link to a cache file, for a folder: each stays.
  for (int swap = 0; swap < 3; ++swap) {
    SCOPED_TRACE(swap);
    write_sample(path("server/a.safetensors"), kIdValues);
    const GeneratedFile f = read(true, path("server/a.safetensors"));
    ASSERT_TRUE(f.ok() && f.removable()) << f.message << f.keep_reason;
    fs::remove(path("server/a.safetensors"));
    if (swap == 0) write_sample(path("server/a.safetensors"), kIdValues);
    if (swap == 1) fs::create_symlink(path("cache/hs_3.safetensors"), path("server/a.safetensors"));
    if (swap == 2) fs::create_directories(path("server/a.safetensors"));
    const auto before = listing();
    for (const std::optional<std::int64_t> row :
         {std::optional<std::int64_t>(), std::optional<std::int64_t>(8)}) {
      const auto error = release_generated(*store(), f, row);
      ASSERT_TRUE(error.has_value());
      EXPECT_NE(std::string(error->what()).find("replaced since it was read"), std::string::npos)
          << error->what();
    }
    EXPECT_EQ(listing(), before);
    fs::remove_all(path("server/a.safetensors"));
  }
  EXPECT_TRUE(fs::is_regular_file(path("cache/hs_3.safetensors")));
}

TEST_F(OnlineGeneratedFileTest, ALockFileThatIsALinkOrAFifoIsAnErrorNotAWait) {
  write_sample(path("server/a.safetensors"), kIdValues);
  write_sample(path("cache/hs_3.safetensors"), kIdValues);
  fs::create_symlink(path("cache/hs_3.safetensors"), path("server/a.safetensors.lock"));
  write_sample(path("server/b.safetensors"), kIdValues);
  ASSERT_EQ(::mkfifo(path("server/b.safetensors.lock").c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  const GeneratedFile a = read(true, path("server/a.safetensors"));
  EXPECT_EQ(a.problem, FileProblem::kUnreadable);
  EXPECT_NE(a.message.find("symbolic link"), std::string::npos) << a.message;
  const GeneratedFile b = read(true, path("server/b.safetensors"));
  EXPECT_EQ(b.problem, FileProblem::kUnreadable);
  EXPECT_NE(b.message.find("not a regular file"), std::string::npos) << b.message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s)  // hang guard
      << "neither may block the reader";
  EXPECT_TRUE(fs::is_regular_file(path("cache/hs_3.safetensors")));
}

TEST(OnlineLockAtTest, MissingLockFileIsNoWait) {
  auto folder = open_folder("/");
  ASSERT_TRUE(folder.ok());
  EXPECT_FALSE(wait_for_lock_at(folder.value().get(), "nonexistent-draftfeed.lock", "x", 1s, 10ms)
                   .has_value());
}

}  // namespace
}  // namespace draftfeed
