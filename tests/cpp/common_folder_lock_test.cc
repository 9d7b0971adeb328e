// The writer lock of a cache folder (common/folder_lock.h): one holder at a time, named to the
// next; a wait that ends when the holder lets go; a holder that dies releases it; the lock file
// opened relative to the folder, a link refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "draftfeed/common/folder_lock.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

class FolderLockTest : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("folder_lock"); }
  std::string folder() const { return dir_.string(); }
};

FolderLock take(const std::string& folder, const std::string& what, double wait = 0) {
  auto lock = FolderLock::acquire(folder, what, std::chrono::duration<double>(wait));
  if (!lock.ok()) throw lock.error();
  return std::move(lock).value();
}

TEST_F(FolderLockTest, ASecondWriterIsRefusedNamingTheHolder) {
  const FolderLock first = take(folder(), "draftfeed pack");
  // Another open file description of the same lock file, in the same process: refused too (an
  // open-file-description lock, not a process's).
  auto second = FolderLock::acquire(folder(), "draftfeed unpack", std::chrono::seconds(0));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().kind(), ErrorKind::kTimeout);
  const std::string message = second.error().what();
  EXPECT_NE(message.find(folder() + " is being rewritten by host " + host_name()),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("pid " + std::to_string(::getpid())), std::string::npos) << message;
  EXPECT_NE(message.find("(draftfeed pack, since "), std::string::npos) << message;

  const auto holder = folder_lock_holder(folder());
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(holder->pid, ::getpid());
  EXPECT_EQ(holder->what, "draftfeed pack");
}

TEST_F(FolderLockTest, ReleasedWithItsOwnerAndFreeToTheNext) {
  { const FolderLock first = take(folder(), "draftfeed pack"); }
  EXPECT_FALSE(folder_lock_holder(folder()).has_value());
  const FolderLock second = take(folder(), "draftfeed quantize");
  EXPECT_EQ(folder_lock_holder(folder())->what, "draftfeed quantize");
}

TEST_F(FolderLockTest, AWaitEndsWhenTheHolderLetsGo) {
  std::optional<FolderLock> first(take(folder(), "draftfeed pack"));
  std::optional<Result<FolderLock>> second;
  std::atomic<bool> waiting{false};
  // 120 s is the hang guard only: the waiter gets the lock as soon as it is let go.
  std::thread waiter([&] {
    waiting = true;
    second.emplace(FolderLock::acquire(folder(), "draftfeed unpack", std::chrono::seconds(120),
                                       std::chrono::milliseconds(5)));
  });
  while (!waiting) std::this_thread::yield();
  EXPECT_EQ(folder_lock_holder(folder())->what, "draftfeed pack");  // not the waiter's yet
  first.reset();
  waiter.join();
  ASSERT_TRUE(second->ok()) << second->error().what();
  EXPECT_EQ(folder_lock_holder(folder())->what, "draftfeed unpack");
}

TEST_F(FolderLockTest, AHolderThatDiesReleasesIt) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = FolderLock::acquire(folder(), "draftfeed pack", std::chrono::seconds(0));
    const char byte = lock.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &byte, 1);
    ::pause();  // killed while it holds the lock
    std::_Exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 'y');
  auto held = FolderLock::acquire(folder(), "draftfeed unpack", std::chrono::seconds(0));
  ASSERT_FALSE(held.ok());
  EXPECT_NE(std::string(held.error().what()).find("pid " + std::to_string(child)),
            std::string::npos)
      << held.error().what();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto after = FolderLock::acquire(folder(), "draftfeed unpack", std::chrono::seconds(0));
  EXPECT_TRUE(after.ok()) << after.error().what();
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(FolderLockTest, ALinkInPlaceOfTheLockFileIsRefused) {
  const std::filesystem::path elsewhere = dir_ / "elsewhere";
  std::filesystem::create_directories(elsewhere);
  std::filesystem::create_directories(dir_ / "cache");
  std::filesystem::create_symlink(elsewhere / "x", dir_ / "cache" / kWriterLockName);
  auto lock =
      FolderLock::acquire((dir_ / "cache").string(), "draftfeed pack", std::chrono::seconds(0));
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(std::string(lock.error().what()).find("is a symbolic link"), std::string::npos)
      << lock.error().what();
  EXPECT_FALSE(std::filesystem::exists(elsewhere / "x"));  // nothing created through the link
}

TEST_F(FolderLockTest, AMissingFolderIsNotFound) {
  auto lock =
      FolderLock::acquire((dir_ / "nope").string(), "draftfeed pack", std::chrono::seconds(0));
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.error().kind(), ErrorKind::kNotFound);
}

TEST_F(FolderLockTest, AHolderRecordWithControlCharactersIsEscaped) {
  const FolderLock first = take(folder(), "draftfeed pack\n\x1b[2Jforged line");
  auto second = FolderLock::acquire(folder(), "draftfeed unpack", std::chrono::seconds(0));
  ASSERT_FALSE(second.ok());
  const std::string message = second.error().what();
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  EXPECT_NE(message.find("draftfeed pack\\x0a\\x1b[2Jforged line"), std::string::npos) << message;
}

TEST_F(FolderLockTest, AnUnknownPolicyIsRefusedByName) {
  ::setenv("DRAFTFEED_WRITER_LOCK", "sometimes", 1);
  EXPECT_THROW(
      {
        try {
          (void)FolderLock::acquire(folder(), "draftfeed pack", std::chrono::seconds(0));
        } catch (const Error& error) {
          ::unsetenv("DRAFTFEED_WRITER_LOCK");
          EXPECT_NE(std::string(error.what()).find("DRAFTFEED_WRITER_LOCK"), std::string::npos);
          throw;
        }
      },
      Error);
  ::unsetenv("DRAFTFEED_WRITER_LOCK");
}

}  // namespace
}  // namespace draftfeed
