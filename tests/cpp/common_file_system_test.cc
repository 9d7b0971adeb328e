// Which file systems count as network ones (common/file_system.h), and how the cache source decides
// whether the copy reads a cache file's rows or maps them (CacheCopy: mapped unless read is
// asked for): a fetched sample to be read passes can_read_file_rows, a mapped one does not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "draftfeed/batch/file_rows_copy.h"
#include "draftfeed/common/error.h"
#include "draftfeed/common/file_system.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/source/cache_source.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

TEST(FileSystemTest, NetworkAndFuseFileSystemsAreNetworkOnes) {
  for (const std::uint64_t type :
       {0x6969ULL, 0x65735546ULL, 0x00c36400ULL, 0x0BD00BD0ULL, 0xFE534D42ULL, 0xFF534D42ULL,
        0x01021997ULL, 0x47504653ULL, 0x5346414FULL}) {
    EXPECT_TRUE(is_network_file_system_type(type)) << std::hex << type;
  }
}

TEST(FileSystemTest, LocalFileSystemsAreNot) {
  // ext2/3/4, xfs, btrfs, tmpfs, overlayfs, zfs, f2fs, ramfs, squashfs.
  for (const std::uint64_t type :
       {0xEF53ULL, 0x58465342ULL, 0x9123683EULL, 0x01021994ULL, 0x794C7630ULL, 0x2FC12FC1ULL,
        0xF2F52010ULL, 0x858458F6ULL, 0x73717368ULL}) {
    EXPECT_FALSE(is_network_file_system_type(type)) << std::hex << type;
  }
}

TEST(FileSystemTest, AMissingPathHasNoType) {
  EXPECT_FALSE(file_system_type("/no/such/folder/draftfeed").has_value());
  EXPECT_FALSE(on_network_file_system("/no/such/folder/draftfeed"));
  EXPECT_TRUE(file_system_type("/").has_value());
}

class CacheCopyTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("cache_copy");
    ::unsetenv("DRAFTFEED_CACHE_COPY");  // NOLINT(concurrency-mt-unsafe): before any thread
    ids_ = {3, 1, 4, 1, 5};
    const std::vector<std::uint16_t> hidden(ids_.size() * 2 * 8, 0x3F80);  // bf16 1.0
    write_sample_file((dir_ / "hs_0.safetensors").string(), ids_, DType::kBF16, 2, 8, hidden);
  }
  void TearDown() override {
    ::unsetenv("DRAFTFEED_CACHE_COPY");  // NOLINT(concurrency-mt-unsafe)
    TempFolderTest::TearDown();
  }

  CacheSourceOptions options(CacheCopy copy) const {
    CacheSourceOptions o;
    o.hidden_states_path = dir_.string();
    o.copy = copy;
    return o;
  }

  // Row 0 fetched through a cache source with `copy`.
  FetchedSample fetch(CacheCopy copy) const {
    CacheSampleSource source(options(copy));
    const IntArrayView view{reinterpret_cast<const std::uint8_t*>(ids_.data()),
                            static_cast<std::int64_t>(ids_.size()), 8, true};
    FetchOutcome outcome = source.fetch(0, view);
    EXPECT_TRUE(outcome.sample.has_value()) << outcome.message;
    return outcome.sample.value_or(FetchedSample{});
  }

  std::vector<std::int64_t> ids_;
};

TEST_F(CacheCopyTest, AutoMapsOnEveryFileSystemReadIsAskedFor) {
  EXPECT_FALSE(options(CacheCopy::kAuto).rows_are_read());
  EXPECT_TRUE(options(CacheCopy::kRead).rows_are_read());
  EXPECT_FALSE(options(CacheCopy::kMap).rows_are_read());

  const FetchedSample read = fetch(CacheCopy::kRead);
  EXPECT_TRUE(read.read_rows);
  EXPECT_TRUE(can_read_file_rows(read));
  for (const CacheCopy copy : {CacheCopy::kAuto, CacheCopy::kMap}) {
    const FetchedSample mapped = fetch(copy);
    EXPECT_FALSE(mapped.read_rows) << cache_copy_name(copy);
    EXPECT_FALSE(can_read_file_rows(mapped)) << cache_copy_name(copy);
    ASSERT_NE(mapped.hidden.data, nullptr);  // the copy takes the rows from the mapping
    EXPECT_EQ(mapped.hidden.tokens, 5);
  }
}

TEST_F(CacheCopyTest, TheEnvironmentOverridesAutoOnly) {
  ::setenv("DRAFTFEED_CACHE_COPY", "map", 1);  // NOLINT(concurrency-mt-unsafe)
  EXPECT_FALSE(options(CacheCopy::kAuto).rows_are_read());
  EXPECT_TRUE(options(CacheCopy::kRead).rows_are_read());
  EXPECT_FALSE(fetch(CacheCopy::kAuto).read_rows);
  ::setenv("DRAFTFEED_CACHE_COPY", "read", 1);  // NOLINT(concurrency-mt-unsafe)
  EXPECT_TRUE(options(CacheCopy::kAuto).rows_are_read());
  EXPECT_FALSE(options(CacheCopy::kMap).rows_are_read());
  ::setenv("DRAFTFEED_CACHE_COPY", "mmap", 1);  // NOLINT(concurrency-mt-unsafe)
  try {
    (void)options(CacheCopy::kAuto).rows_are_read();
    FAIL() << "a bad DRAFTFEED_CACHE_COPY was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("DRAFTFEED_CACHE_COPY"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("'mmap'"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace draftfeed
