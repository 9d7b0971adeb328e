// The SIGBUS guard (common/fault_guard.h): reads of a mapping whose file was truncated return false
// instead of killing the process; faults outside a guard still reach whoever handled them before
// (or kill, as without the guard); a handler installed over ours is chained, not lost. The suite
// whose name starts with Concurrent also runs under ThreadSanitizer in CI.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/mapped_file.h"
#include "sigbus_recovery.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

class FaultGuardTest : public TempFolderTest {
 protected:
  void SetUp() override { make_temp_folder("fault_guard"); }

  // A file of `pages` pages of the byte 0x5A, mapped; then cut to `keep` bytes behind the mapping.
  std::shared_ptr<const MappedFile> mapped_then_truncated(std::size_t pages, std::size_t keep,
                                                          const std::string& name = "f") {
    const std::string path = (dir_ / name).string();
    const std::size_t size = pages * page();
    {
      const std::vector<char> bytes(size, 0x5A);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      EXPECT_GE(fd, 0);
      EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(size));
      ::close(fd);
    }
    auto mapping = MappedFile::open_or_throw(path);
    EXPECT_EQ(::truncate(path.c_str(), static_cast<off_t>(keep)), 0);
    return mapping;
  }

  static std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }
};

TEST_F(FaultGuardTest, ReadPastATruncatedEndReturnsFalseAndCounts) {
  const auto mapping = mapped_then_truncated(4, page());  // pages 1..3 are gone
  std::vector<std::uint8_t> out(mapping->size());
  const std::uint64_t before = guarded_faults();
  EXPECT_TRUE(guarded_copy(out.data(), mapping->data(), page()));  // the page that is left
  EXPECT_EQ(out[0], 0x5A);
  EXPECT_FALSE(guarded_copy(out.data(), mapping->data(), mapping->size()));
  EXPECT_FALSE(guarded_copy(out.data(), mapping->data() + 3 * page(), 1));
  EXPECT_EQ(guarded_faults(), before + 2);
  // The thread carries on as usual, guards included.
  EXPECT_TRUE(guarded_copy(out.data(), mapping->data(), 16));
}

TEST_F(FaultGuardTest, AScopeOfManyGuardsCatchesEachFault) {
  const auto mapping = mapped_then_truncated(4, page());
  const MappedReadScope reads;
  std::vector<std::uint8_t> out(mapping->size());
  const std::uint64_t before = guarded_faults();
  for (int round = 0; round < 100; ++round) {
    ASSERT_TRUE(reads.copy(out.data(), mapping->data(), page()));
    ASSERT_FALSE(reads.copy(out.data(), mapping->data() + 2 * page(), 8));
  }
  EXPECT_EQ(guarded_faults(), before + 100);
  int touched = 0;
  EXPECT_FALSE(reads.guard([&] {
    touched = mapping->data()[0];
    touched += mapping->data()[page()];
  }));
  EXPECT_EQ(touched, 0x5A);
  EXPECT_TRUE(reads.copy(out.data(), mapping->data(), 0));
}

TEST_F(FaultGuardTest, TheFaultingAddressTellsWhichMappingShrank) {
  const auto kept = mapped_then_truncated(2, 2 * page(), "kept");
  const auto cut = mapped_then_truncated(2, 0, "cut");
  std::uint8_t sum = 0;
  const bool read = guard_mapped_reads([&] {
    for (std::size_t i = 0; i < kept->size(); ++i)
      sum = static_cast<std::uint8_t>(sum + kept->data()[i]);
    for (std::size_t i = 0; i < cut->size(); ++i)
      sum = static_cast<std::uint8_t>(sum + cut->data()[i]);
  });
  EXPECT_FALSE(read);
  EXPECT_EQ(last_guarded_fault_address(), cut->data());  // its first byte: the file is empty now
  EXPECT_FALSE(guarded_copy(&sum, cut->data() + page() + 5, 1));
  EXPECT_EQ(last_guarded_fault_address(), cut->data() + page() + 5);
}

TEST_F(FaultGuardTest, ACallableSeesItsEffectsUpToTheFaultAndExceptionsPass) {
  const auto mapping = mapped_then_truncated(2, page());
  std::size_t read = 0;
  const bool completed = guard_mapped_reads([&] {
    for (std::size_t i = 0; i < mapping->size(); i += 512) {
      read += mapping->data()[i] == 0x5A ? 1 : 0;
    }
  });
  EXPECT_FALSE(completed);
  EXPECT_EQ(read, page() / 512);  // every read of the first page, none of the second
  EXPECT_THROW(guard_mapped_reads([] { throw std::runtime_error("thrown inside"); }),
               std::runtime_error);
  // The guard was unwound with the exception: a later fault is still caught.
  std::uint8_t byte = 0;
  EXPECT_FALSE(guarded_copy(&byte, mapping->data() + page(), 1));
}

TEST_F(FaultGuardTest, NestedGuardsReturnToTheInnermost) {
  const auto mapping = mapped_then_truncated(2, 0);
  bool inner = true;
  const bool outer = guard_mapped_reads([&] {
    std::uint8_t byte = 0;
    inner = guarded_copy(&byte, mapping->data(), 1);
  });
  EXPECT_FALSE(inner);
  EXPECT_TRUE(outer);
}

// What the handler before ours does with a SIGBUS: the default action kills the process; under
// AddressSanitizer, whose own handler was there first, the process reports "BUS" and exits 1.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerHandlesFaults = true;
#else
constexpr bool kSanitizerHandlesFaults = false;
#endif

bool died_of_the_fault(int status) {
  if (kSanitizerHandlesFaults) return WIFEXITED(status) && WEXITSTATUS(status) == 1;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
}

TEST_F(FaultGuardTest, AFaultOutsideAGuardStillKillsTheProcess) {
  const auto mapping = mapped_then_truncated(2, 0);
  std::uint8_t byte = 0;
  EXPECT_TRUE(guarded_copy(&byte, &byte, 1));  // installs the handler
  EXPECT_EXIT(
      {
        volatile std::uint8_t value = mapping->data()[page()];
        (void)value;
        std::_Exit(0);
      },
      died_of_the_fault, kSanitizerHandlesFaults ? "BUS" : "");
}

std::atomic<int> foreign_calls{0};
void foreign_handler(int /*signal*/) {
  foreign_calls.fetch_add(1);
  std::_Exit(42);
}

TEST_F(FaultGuardTest, AHandlerInstalledOverOursIsChainedNotLost) {
  const auto mapping = mapped_then_truncated(2, 0);
  EXPECT_EXIT(
      {
        // As Python's faulthandler.enable() or a debugger would, after our first guard.
        std::uint8_t byte = 0;
        (void)guarded_copy(&byte, &byte, 1);
        struct sigaction theirs {};
        theirs.sa_handler = &foreign_handler;
        sigemptyset(&theirs.sa_mask);
        ::sigaction(SIGBUS, &theirs, nullptr);
        // Our guard still works (it puts its handler back on top)...
        if (guarded_copy(&byte, mapping->data(), 1)) std::_Exit(1);
        // ...and a fault outside any guard reaches theirs.
        volatile std::uint8_t value = mapping->data()[0];
        (void)value;
        std::_Exit(2);
      },
      ::testing::ExitedWithCode(42), "");
}

TEST_F(FaultGuardTest, ConcurrentGuardsOnManyThreadsEachCatchTheirOwnFaults) {
  SKIP_WHERE_SIGBUS_CANNOT_BE_RECOVERED();
  const auto gone = mapped_then_truncated(8, 0, "gone");
  const auto intact = mapped_then_truncated(8, 8 * page(), "intact");
  std::atomic<int> caught{0};
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::uint8_t> out(gone->size());
      for (int i = 0; i < 200; ++i) {
        const bool fault_now = (i + t) % 2 == 0;
        const auto& source = fault_now ? gone : intact;
        if (guarded_copy(out.data(), source->data(), source->size())) {
          completed.fetch_add(fault_now ? 1000 : 1);
        } else {
          caught.fetch_add(fault_now ? 1 : 1000);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(caught.load(), 400);
  EXPECT_EQ(completed.load(), 400);
}

}  // namespace
}  // namespace draftfeed
