// Statistics as a tree of named values, groups and lists, for reports: the Python dicts
// (python/bindings/stats_dict.h) and the command line's JSON (src/cli/stats_json.h) are made from
// it alike, so each statistic is named once, in its struct's `for_each_stat`:
//
//   template <typename Visit>
//   void for_each_stat(const MyStats& s, Visit&& visit) {
//     visit("opened", s.opened);        // a number, a bool, a string or strings: a value
//     visit("client", s.client);        // a struct with its own for_each_stat: a group
//     visit("endpoints", s.endpoints);  // a vector of such structs: a list of groups
//     visit("problems", named_counts(s.problems, problem_name));  // counts by an enum's names
//   }
//
// and `stats_tree(s)` builds the tree. Sources report theirs through SampleSource::stats_report,
// so the loader and the reports know no source by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace draftfeed {

struct StatsTree {
  // A value: a number, a bool, a string or a list of strings (a dataset's shard paths).
  using Value = std::variant<std::int64_t, std::uint64_t, double, bool, std::string,
                             std::vector<std::string>>;
  struct Group;  // a name and a tree (defined below: a tree holds trees)
  struct List;   // a name and trees
  std::vector<std::pair<std::string, Value>> values;
  std::vector<Group> groups;
  std::vector<List> lists;

  void add_group(std::string name, StatsTree tree);
  // The group `name`, or null.
  const StatsTree* group(const std::string& name) const;
};

struct StatsTree::Group {
  std::string name;
  StatsTree tree;
};

struct StatsTree::List {
  std::string name;
  std::vector<StatsTree> items;
};

inline void StatsTree::add_group(std::string name, StatsTree tree) {
  groups.push_back(Group{std::move(name), std::move(tree)});
}

inline const StatsTree* StatsTree::group(const std::string& name) const {
  for (const Group& g : groups) {
    if (g.name == name) return &g.tree;
  }
  return nullptr;
}

template <typename Stats>
StatsTree stats_tree(const Stats& stats);

namespace stats_detail {

template <typename T>
struct is_vector : std::false_type {};
template <typename T, typename A>
struct is_vector<std::vector<T, A>> : std::true_type {};

class Builder {
 public:
  explicit Builder(StatsTree& tree) : tree_(tree) {}

  template <typename T>
  void operator()(const char* name, const T& value) const {
    // Stored as they are: a bool, or a list of strings (a dataset's shard paths).
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::vector<std::string>>) {
      tree_.values.emplace_back(name, value);
    } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      tree_.values.emplace_back(name, static_cast<std::int64_t>(value));
    } else if constexpr (std::is_integral_v<T>) {
      tree_.values.emplace_back(name, static_cast<std::uint64_t>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      tree_.values.emplace_back(name, static_cast<double>(value));
    } else if constexpr (std::is_convertible_v<const T&, std::string>) {
      tree_.values.emplace_back(name, std::string(value));
    } else if constexpr (std::is_same_v<T, StatsTree>) {
      tree_.add_group(name, value);
    } else if constexpr (is_vector<T>::value) {
      std::vector<StatsTree> items;
      items.reserve(value.size());
      for (const auto& item : value) items.push_back(stats_tree(item));
      tree_.lists.push_back(StatsTree::List{name, std::move(items)});
    } else {
      tree_.add_group(name, stats_tree(value));
    }
  }

 private:
  StatsTree& tree_;
};

}  // namespace stats_detail

template <typename Stats>
StatsTree stats_tree(const Stats& stats) {
  StatsTree tree;
  for_each_stat(stats, stats_detail::Builder(tree));
  return tree;
}

// Counts indexed by an enum, under the enum's names, from index `first` (0 is often "none").
template <typename Enum, typename Counts>
StatsTree named_counts(const Counts& counts, const char* (*name_of)(Enum), std::size_t first = 0) {
  StatsTree tree;
  for (std::size_t i = first; i < counts.size(); ++i) {
    tree.values.emplace_back(name_of(static_cast<Enum>(i)), static_cast<std::int64_t>(counts[i]));
  }
  return tree;
}

}  // namespace draftfeed
