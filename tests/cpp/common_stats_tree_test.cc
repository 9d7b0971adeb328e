// Statistics declared once (common/stats_tree.h): a struct's for_each_stat gives the tree every
// report is made from, groups and lists included, and the loader's metrics carry its source's
// report without knowing the source.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <variant>
#include <vector>

#include "draftfeed/common/stats_tree.h"
#include "draftfeed/dataset/dataset_writer.h"
#include "draftfeed/hidden/fp8_convert.h"
#include "draftfeed/pack/pack_writer.h"
#include "draftfeed/sampler/multipack.h"
#include "draftfeed/source/lookahead_source.h"
#include "draftfeed/source/online_source.h"

namespace draftfeed {
namespace {

struct Inner {
  int hits = 3;
};
template <typename Visit>
void for_each_stat(const Inner& s, Visit&& visit) {
  visit("hits", s.hits);
}

enum class Colour : std::uint8_t { kNone, kRed, kBlue };
const char* colour_name(Colour c) {
  return c == Colour::kRed ? "red" : c == Colour::kBlue ? "blue" : "none";
}

struct Outer {
  std::uint64_t bytes = 7;
  double seconds = 0.5;
  bool fatal = true;
  std::string model = "m";
  Inner inner;
  std::vector<Inner> each{Inner{1}, Inner{2}};
  std::array<std::int64_t, 3> by_colour{0, 4, 5};
};
template <typename Visit>
void for_each_stat(const Outer& s, Visit&& visit) {
  visit("bytes", s.bytes);
  visit("seconds", s.seconds);
  visit("fatal", s.fatal);
  visit("model", s.model);
  visit("inner", s.inner);
  visit("each", s.each);
  visit("by_colour", named_counts(s.by_colour, colour_name, 1));
}

TEST(StatsTreeTest, ValuesGroupsListsAndNamedCountsKeepTheirNamesAndTypes) {
  const StatsTree tree = stats_tree(Outer{});
  ASSERT_EQ(tree.values.size(), 4u);
  EXPECT_EQ(tree.values[0].first, "bytes");
  EXPECT_EQ(std::get<std::uint64_t>(tree.values[0].second), 7u);
  EXPECT_EQ(std::get<double>(tree.values[1].second), 0.5);
  EXPECT_TRUE(std::get<bool>(tree.values[2].second));
  EXPECT_EQ(std::get<std::string>(tree.values[3].second), "m");
  ASSERT_NE(tree.group("inner"), nullptr);
  EXPECT_EQ(std::get<std::int64_t>(tree.group("inner")->values.at(0).second), 3);
  ASSERT_EQ(tree.lists.size(), 1u);
  EXPECT_EQ(tree.lists[0].items.size(), 2u);
  const StatsTree* colours = tree.group("by_colour");
  ASSERT_NE(colours, nullptr);
  ASSERT_EQ(colours->values.size(), 2u) << "index 0 (none) left out";
  EXPECT_EQ(colours->values[0].first, "red");
  EXPECT_EQ(std::get<std::int64_t>(colours->values[1].second), 5);
}

// The sources' reports hold every field of their stats structs (the lookahead's 17, the online
// source's 17 values and its groups).
TEST(StatsTreeTest, TheSourcesStatsAreReportedWhole) {
  const StatsTree lookahead = stats_tree(LookaheadStats{});
  EXPECT_EQ(lookahead.values.size(), 11u);
  // The read-ahead memory group, as the file read-ahead reports it (read_ahead/byte_budget.h).
  ASSERT_NE(lookahead.group("memory"), nullptr);
  EXPECT_EQ(lookahead.group("memory")->values.size(), 6u);
  const StatsTree online = stats_tree(OnlineSourceStats{});
  EXPECT_EQ(online.values.size(), 17u);
  ASSERT_NE(online.group("client"), nullptr);
  ASSERT_NE(online.group("request_failures"), nullptr);
  ASSERT_NE(online.group("file_failures"), nullptr);
  EXPECT_EQ(online.group("file_failures")->values.size(),
            static_cast<std::size_t>(FileProblem::kCount) - 1);
}

// The reports the commands and the bindings print are declared once each, as the statistics: every
// field of the struct in its tree (a field added to one but not the other changes the count).
TEST(StatsTreeTest, TheReportsAreDeclaredOnce) {
  DatasetWriteSummary written;
  written.rows = 2;
  written.shard_paths = {"a.arrow", "b.arrow"};
  const StatsTree dataset = stats_tree(written);
  ASSERT_EQ(dataset.values.size(), 4u);
  EXPECT_EQ(dataset.values[2].first, "shards");
  EXPECT_EQ(std::get<std::vector<std::string>>(dataset.values[2].second), written.shard_paths);
  EXPECT_EQ(stats_tree(PlanCounts{}).values.size(), sizeof(PlanCounts) / 8);
  // Their own fields (CacheRewriteReport's: the rewrite commands' add_rewrite_json).
  EXPECT_EQ(stats_tree(PackReport{}).values.size(),
            (sizeof(PackReport) - sizeof(CacheRewriteReport)) / 8);
  EXPECT_EQ(stats_tree(CacheConvertReport{}).values.size(),
            (sizeof(CacheConvertReport) - sizeof(CacheRewriteReport)) / 8);
  const StatsTree unpack = stats_tree(UnpackReport{});
  EXPECT_EQ(unpack.values.size(), 3u);  // written, failed (of the skipped), removed_pack
}

}  // namespace
}  // namespace draftfeed
