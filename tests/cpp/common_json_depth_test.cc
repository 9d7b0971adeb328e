#include <gtest/gtest.h>

#include <string>

#include "draftfeed/common/json_depth.h"

namespace draftfeed {
namespace {

TEST(JsonDepthTest, CountsBracketsOutsideStrings) {
  EXPECT_TRUE(json_depth_within("{}", 1));
  EXPECT_TRUE(json_depth_within(R"({"a": [1, {"b": 2}]})", 3));
  EXPECT_FALSE(json_depth_within(R"({"a": [1, {"b": 2}]})", 2));
  // Brackets inside strings do not count, escaped quotes do not end a string.
  EXPECT_TRUE(json_depth_within(R"({"a": "[[[[[[\"[[[[", "b": [1]})", 2));
  EXPECT_FALSE(json_depth_within("[[[", 2));
}

TEST(JsonDepthTest, TheDefaultLimitIsTheOneEveryReaderUses) {
  const std::string at_limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  const std::string past = "[" + at_limit + "]";
  EXPECT_TRUE(json_depth_within(at_limit));
  EXPECT_FALSE(json_depth_within(past));
  EXPECT_FALSE(json_depth_within(std::string(1000000, '[')));
  EXPECT_EQ(json_too_deep_text(), "JSON nested deeper than 64 levels");
}

}  // namespace
}  // namespace draftfeed
