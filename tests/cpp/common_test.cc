#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "draftfeed/common/error.h"
#include "draftfeed/common/mapped_file.h"

namespace draftfeed {
namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("draftfeed_common_test_" + std::to_string(::getpid()) + "_" + name);
}

TEST(MappedFileTest, MapsTheWholeFile) {
  const auto path = temp_path("data");
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello mapped world";
  }
  auto file = MappedFile::open(path.string());
  ASSERT_TRUE(file.ok()) << file.error().what();
  EXPECT_EQ(file.value()->size(), 18u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.value()->data()), 5), "hello");
  EXPECT_EQ(file.value()->path(), path.string());
  std::filesystem::remove(path);
}

TEST(MappedFileTest, EmptyFileIsAnEmptySpan) {
  const auto path = temp_path("empty");
  std::ofstream(path).close();
  auto file = MappedFile::open(path.string());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file.value()->size(), 0u);
  EXPECT_TRUE(file.value()->bytes().empty());
  std::filesystem::remove(path);
}

TEST(MappedFileTest, MissingFileIsNotFoundAndNamesThePath) {
  auto file = MappedFile::open("/nonexistent/draftfeed/file.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().kind(), ErrorKind::kNotFound);
  EXPECT_NE(std::string(file.error().what()).find("/nonexistent/draftfeed/file.bin"),
            std::string::npos);
}

TEST(MappedFileTest, FolderIsRefused) {
  auto file = MappedFile::open(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().kind(), ErrorKind::kIo);
  EXPECT_NE(std::string(file.error().what()).find("not a regular file"), std::string::npos);
}

TEST(ResultTest, ValueThrowsTheCarriedError) {
  Result<int> bad = Error(ErrorKind::kFormat, "row 7: bad");
  EXPECT_FALSE(bad.ok());
  try {
    (void)bad.value();
    FAIL() << "value() of an error must throw";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kFormat);
    EXPECT_STREQ(error.what(), "row 7: bad");
  }
  Result<int> good = 5;
  EXPECT_EQ(good.value(), 5);
}

}  // namespace
}  // namespace draftfeed
