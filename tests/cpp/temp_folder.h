// A fresh folder per test, for tests that write files: <tmp>/draftfeed_<prefix>_<pid>_<test name>,
// emptied before the test and removed after it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <string>

namespace draftfeed {

class TempFolderTest : public ::testing::Test {
 protected:
  void make_temp_folder(const std::string& prefix,
                        std::initializer_list<const char*> subfolders = {}) {
    // A parameterised test's name has a '/' ("Name/3"): one folder, not a folder in a folder that
    // TearDown would leave behind.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::temp_directory_path() /
           ("draftfeed_" + prefix + "_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* sub : subfolders) std::filesystem::create_directories(dir_ / sub);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
};

}  // namespace draftfeed
