// read_control_file: a FIFO, a socket, a device, a folder or a link under a control file's name
// are refused without blocking and named; an oversized file is refused before anything is
// allocated; a file read whole comes back with its identity.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "draftfeed/common/control_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;

const ControlFileRules kManifest{std::uint64_t{1} << 30, "a manifest", ControlFileLinks::kRefuse};

class ControlFileTest : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("control_file"); }

  std::string path(const char* name) const { return (dir_ / name).string(); }
  void write(const char* name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }

  // The read's error, run on another thread so that a read that blocks fails the test (after a
  // hang guard's 20 s) instead of hanging it.
  static Error refusal(const std::string& file, const ControlFileRules& rules) {
    auto read = std::async(std::launch::async, [=] { return read_control_file(file, rules); });
    if (read.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      std::fprintf(stderr, "%s: the read blocked\n", file.c_str());
      std::_Exit(1);  // the blocked thread cannot be joined
    }
    Result<ControlFile> result = read.get();
    if (result.ok()) {
      ADD_FAILURE() << file << ": read " << result.value().bytes.size() << " bytes, not refused";
      return Error(ErrorKind::kRuntime, "");
    }
    return result.error();
  }
};

TEST_F(ControlFileTest, ReadsARegularFileWholeWithItsIdentity) {
  write("manifest.json", "{\"format\": 1}");
  const Result<ControlFile> read = read_control_file(path("manifest.json"), kManifest);
  ASSERT_TRUE(read.ok()) << read.error().what();
  EXPECT_EQ(read.value().bytes, "{\"format\": 1}");
  struct stat st {};
  ASSERT_EQ(::stat(path("manifest.json").c_str(), &st), 0);
  EXPECT_EQ(read.value().identity.inode, static_cast<std::uint64_t>(st.st_ino));
  EXPECT_EQ(read.value().identity.device, static_cast<std::uint64_t>(st.st_dev));

  write("empty.json", "");
  const Result<ControlFile> empty = read_control_file(path("empty.json"), kManifest);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty.value().bytes.empty());
}

TEST_F(ControlFileTest, ReadsRelativeToTheFolderDescriptor) {
  write("state.json", "abc");
  const UniqueFd folder(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(folder);
  // The folder's name now names another folder: the descriptor still reads the first.
  fs::rename(dir_, dir_.string() + ".moved");
  fs::create_directories(dir_);
  std::ofstream(dir_ / "state.json") << "other";
  const Result<ControlFile> read =
      read_control_file_at(folder.get(), dir_.string(), "state.json", kManifest);
  fs::remove_all(dir_.string() + ".moved");
  ASSERT_TRUE(read.ok()) << read.error().what();
  EXPECT_EQ(read.value().bytes, "abc");
}

TEST_F(ControlFileTest, AFifoNeverBlocksAndIsNamed) {
  ASSERT_EQ(::mkfifo(path("state.json").c_str(), 0644), 0);
  const Error error = refusal(path("state.json"), kManifest);
  EXPECT_EQ(error.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(std::string(error.what()), path("state.json") + ": is a FIFO, not a regular file");
  // Followed links too: the FIFO is looked at, never opened for a read that would block.
  const ControlFileRules follow{1024, "a dataset's state.json", ControlFileLinks::kFollow};
  EXPECT_EQ(std::string(refusal(path("state.json"), follow).what()),
            path("state.json") + ": is a FIFO, not a regular file");
}

TEST_F(ControlFileTest, ALinkIsRefusedOrFollowedToARegularFileOnly) {
  fs::create_symlink("/dev/zero", dir_ / "zero.json");
  const Error link = refusal(path("zero.json"), kManifest);
  EXPECT_EQ(link.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(std::string(link.what()),
            path("zero.json") +
                ": is a symbolic link; a manifest is read from a regular file only, never "
                "through a link");

  const ControlFileRules follow{1024, "a dataset's state.json", ControlFileLinks::kFollow};
  const Error device = refusal(path("zero.json"), follow);
  EXPECT_EQ(device.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(std::string(device.what()),
            path("zero.json") + ": is a character device, not a regular file");

  write("blob", "[1]");
  fs::create_symlink(dir_ / "blob", dir_ / "state.json");
  const Result<ControlFile> followed = read_control_file(path("state.json"), follow);
  ASSERT_TRUE(followed.ok()) << followed.error().what();
  EXPECT_EQ(followed.value().bytes, "[1]");
  EXPECT_FALSE(read_control_file(path("state.json"), kManifest).ok());
}

TEST_F(ControlFileTest, FoldersAndSocketsAreNamed) {
  fs::create_directories(dir_ / "manifest.json");
  EXPECT_EQ(std::string(refusal(path("manifest.json"), kManifest).what()),
            path("manifest.json") + ": is a folder, not a regular file");

  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string socket_path = path("s.json");
  ASSERT_LT(socket_path.size(), sizeof address.sun_path);
  socket_path.copy(address.sun_path, socket_path.size());
  ASSERT_EQ(::bind(sock, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(std::string(refusal(socket_path, kManifest).what()),
            socket_path + ": is a socket, not a regular file");
  ::close(sock);
}

TEST_F(ControlFileTest, AnOversizedFileIsRefusedBeforeItIsRead) {
  // A sparse 5 GB file: refused by its size, never allocated.
  {
    const UniqueFd fd(::open(path("manifest.json").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::ftruncate(fd.get(), 5'000'000'000), 0);
  }
  const Error error = refusal(path("manifest.json"), kManifest);
  EXPECT_EQ(error.kind(), ErrorKind::kFormat);
  EXPECT_EQ(std::string(error.what()),
            path("manifest.json") +
                ": is 5.00 GB (5000000000 bytes), more than the 1 GiB a manifest may be");

  write("small.json", std::string(65, 'x'));
  const ControlFileRules tiny{64, "a port file", ControlFileLinks::kRefuse};
  EXPECT_EQ(std::string(refusal(path("small.json"), tiny).what()),
            path("small.json") + ": is 65 bytes, more than the 64 bytes a port file may be");
}

TEST_F(ControlFileTest, AMissingFileIsNotFound) {
  const Error error = refusal(path("none.json"), kManifest);
  EXPECT_EQ(error.kind(), ErrorKind::kNotFound);
  EXPECT_NE(std::string(error.what()).find(path("none.json")), std::string::npos);
}

TEST_F(ControlFileTest, AFileThatHoldsMoreThanItsSizeIsRefused) {
  // /proc files say 0 bytes and hold more: exactly what a file growing while read looks like.
  const ControlFileRules rules{1 << 20, "a status file", ControlFileLinks::kFollow};
  const Error error = refusal("/proc/self/status", rules);
  EXPECT_EQ(error.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(error.what()),
            "/proc/self/status: changed while it was read (it had 0 bytes when opened and held "
            "more when read): is another process writing it? Read it again when it is done");
}

TEST(ByteCountText, ReadsAsPeopleWriteSizes) {
  EXPECT_EQ(byte_count_text(0), "0 bytes");
  EXPECT_EQ(byte_count_text(1), "1 byte");
  EXPECT_EQ(byte_count_text(999), "999 bytes");
  EXPECT_EQ(byte_count_text(1024), "1 KiB");
  EXPECT_EQ(byte_count_text(std::uint64_t{64} << 20), "64 MiB");
  EXPECT_EQ(byte_count_text(std::uint64_t{3} << 30), "3 GiB");
  EXPECT_EQ(byte_count_text(std::uint64_t{1} << 40), "1 TiB");
  EXPECT_EQ(byte_count_text(std::uint64_t{2048} << 40), "2048 TiB");
  EXPECT_EQ(byte_count_text(5'368'709'121), "5.37 GB");
  EXPECT_EQ(byte_count_text(1500), "1.50 KB");
}

}  // namespace
}  // namespace draftfeed
