// Reading a server's file from a handle: confinement to the server folder (through `..` and links),
// refusing the cache's own files, FIFOs, folders and oversized files, the lock protocol for owned
// and foreign files, and the validation outcomes. Listings before/after show nothing foreign moved.
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

  GeneratedFileReader reader(bool with_server_dir, std::uint64_t max_bytes = 1 << 20) const {
    CacheStoreOptions store;
    store.root = path("cache");
    if (with_server_dir) store.allowed_folders = {path("server")};
    GeneratedFileOptions o;
    if (with_server_dir) o.server_dir = path("server");
    o.max_file_bytes = max_bytes;
    o.lock_timeout = 300ms;
    o.lock_poll = 10ms;
    return GeneratedFileReader(std::make_shared<const CacheStore>(store), o);
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

TEST_F(OnlineGeneratedFileTest, ReadsAValidOwnedFileAndRemovesItsReleasedLock) {
  write_sample(path("server/a.safetensors"), kIdValues);
  std::ofstream(path("server/a.safetensors.lock")).close();  // released by its writer
  const GeneratedFile f = reader(true).read(path("server/a.safetensors"), kIds, 3);
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_TRUE(f.owned);
  EXPECT_EQ(f.path, fs::canonical(path("server/a.safetensors")).string());
  EXPECT_EQ(f.sample->hidden_states.shape, (std::vector<std::int64_t>{3, 2, 4}));
  EXPECT_FALSE(fs::exists(path("server/a.safetensors.lock"))) << "the reference removes it";
}

TEST_F(OnlineGeneratedFileTest, RefusesHandlesOutsideTheServerFolder) {
  write_sample(path("elsewhere/x.safetensors"), kIdValues);
  fs::create_symlink(path("elsewhere/x.safetensors"), path("server/link.safetensors"));
  const auto before = listing();
  for (const std::string& handle :
       {path("server/../elsewhere/x.safetensors"), path("server/link.safetensors"),
        path("elsewhere/x.safetensors"), path("server"), std::string("relative/x.safetensors")}) {
    const GeneratedFile f = reader(true).read(handle, kIds, 0);
    EXPECT_EQ(f.problem, FileProblem::kOutsideServerDir) << handle << ": " << f.message;
    EXPECT_FALSE(f.owned);
    EXPECT_NE(f.message.find("outside the server folder"), std::string::npos) << f.message;
  }
  EXPECT_EQ(listing(), before) << "nothing may be created, moved or removed";
}

TEST_F(OnlineGeneratedFileTest, ReadsForeignFilesWithoutAServerFolderButNeverOwnsThem) {
  write_sample(path("elsewhere/x.safetensors"), kIdValues);
  std::ofstream(path("elsewhere/x.safetensors.lock")).close();
  const auto before = listing();
  const GeneratedFile f = reader(false).read(path("elsewhere/x.safetensors"), kIds, 0);
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_FALSE(f.owned);
  EXPECT_EQ(listing(), before) << "a foreign lock file is not removed";
}

TEST_F(OnlineGeneratedFileTest, WaitsForAForeignWritersLockAndTimesOut) {
  write_sample(path("elsewhere/x.safetensors"), kIdValues);
  const int fd = ::open(path("elsewhere/x.safetensors.lock").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const auto start = std::chrono::steady_clock::now();
  const GeneratedFile f = reader(false).read(path("elsewhere/x.safetensors"), kIds, 0);
  EXPECT_EQ(f.problem, FileProblem::kLockTimeout) << f.message;
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  // Released while a reader waits: the reader goes on.
  std::thread release([fd] {
    std::this_thread::sleep_for(100ms);
    ::flock(fd, LOCK_UN);
  });
  const GeneratedFile g = reader(false).read(path("elsewhere/x.safetensors"), kIds, 0);
  release.join();
  ::close(fd);
  EXPECT_TRUE(g.ok()) << g.message;
  EXPECT_TRUE(fs::exists(path("elsewhere/x.safetensors.lock")));
}

TEST_F(OnlineGeneratedFileTest, OwnedFileLockHeldTooLongIsALockTimeout) {
  write_sample(path("server/a.safetensors"), kIdValues);
  const int fd = ::open(path("server/a.safetensors.lock").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const GeneratedFile f = reader(true).read(path("server/a.safetensors"), kIds, 0);
  ::close(fd);
  EXPECT_EQ(f.problem, FileProblem::kLockTimeout) << f.message;
  EXPECT_TRUE(f.owned);
}

TEST_F(OnlineGeneratedFileTest, RefusesTheCachesOwnFiles) {
  write_sample(path("cache/hs_3.safetensors"), kIdValues);
  write_sample(path("cache/.hs_4.safetensors.adopt-1-1"), kIdValues);
  const auto before = listing();
  for (const char* name : {"cache/hs_3.safetensors", "cache/.hs_4.safetensors.adopt-1-1"}) {
    const GeneratedFile f = reader(false).read(path(name), kIds, 9);
    EXPECT_EQ(f.problem, FileProblem::kCacheFile) << f.message;
  }
  EXPECT_EQ(listing(), before);
}

TEST_F(OnlineGeneratedFileTest, OnlyRegularFilesOfBoundedSizeAreOpened) {
  ASSERT_EQ(::mkfifo(path("server/fifo.safetensors").c_str(), 0644), 0);
  fs::create_directories(path("server/folder.safetensors"));
  write_sample(path("server/big.safetensors"), kIdValues);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(reader(true).read(path("server/fifo.safetensors"), kIds, 0).problem,
            FileProblem::kNotRegular);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "a FIFO must not block the reader";
  EXPECT_EQ(reader(true).read(path("server/folder.safetensors"), kIds, 0).problem,
            FileProblem::kNotRegular);
  const GeneratedFile big = reader(true, 64).read(path("server/big.safetensors"), kIds, 0);
  EXPECT_EQ(big.problem, FileProblem::kTooLarge);
  EXPECT_NE(big.message.find("limit of 64"), std::string::npos) << big.message;
}

TEST_F(OnlineGeneratedFileTest, ClassifiesBadFiles) {
  EXPECT_EQ(reader(true).read(path("server/none.safetensors"), kIds, 0).problem,
            FileProblem::kMissing);
  std::ofstream(path("server/junk.safetensors")) << "definitely not safetensors";
  EXPECT_EQ(reader(true).read(path("server/junk.safetensors"), kIds, 0).problem,
            FileProblem::kCorrupt);
  write_sample(path("server/other.safetensors"), {5, 6, 8});
  const GeneratedFile mismatch = reader(true).read(path("server/other.safetensors"), kIds, 11);
  EXPECT_EQ(mismatch.problem, FileProblem::kTokenMismatch);
  EXPECT_NE(mismatch.message.find("row 11"), std::string::npos) << mismatch.message;
  write_sample(path("server/short.safetensors"), {5, 6});
  EXPECT_EQ(reader(true).read(path("server/short.safetensors"), kIds, 0).problem,
            FileProblem::kTokenMismatch);
  write_sample(path("server/nan.safetensors"), kIdValues, std::nanf(""));
  const GeneratedFile nan = reader(true).read(path("server/nan.safetensors"), kIds, 0);
  EXPECT_EQ(nan.problem, FileProblem::kNonFinite);
  EXPECT_TRUE(nan.owned);
  write_sample(path("server/inf.safetensors"), kIdValues, INFINITY);
  EXPECT_EQ(reader(true).read(path("server/inf.safetensors"), kIds, 0).problem,
            FileProblem::kNonFinite);
}

TEST(OnlineForeignLockTest, MissingLockFileIsNoWait) {
  EXPECT_FALSE(wait_for_foreign_lock("/nonexistent/dir/x.lock", 1s, 10ms).has_value());
}

}  // namespace
}  // namespace draftfeed
