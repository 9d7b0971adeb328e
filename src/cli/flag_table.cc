#include "flag_table.h"

#include <cstdio>
#include <sstream>

namespace draftfeed::cli {

namespace {

// `paragraph` wrapped to lines of at most `width` characters (a longer word stays whole).
std::vector<std::string> wrapped(const std::string& paragraph, std::size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(paragraph);
  std::string word;
  std::string line;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      // A continuation line never starts with a flag ("--x"): it would read as an option line of
      // its own. The word before it goes down with it.
      const std::size_t last = line.rfind(' ');
      if (word.rfind("--", 0) == 0 && last != std::string::npos) {
        lines.push_back(line.substr(0, last));
        line = line.substr(last + 1);
      } else {
        lines.push_back(line);
        line.clear();
      }
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

FlagTable& FlagTable::add(const FlagTable& more, const std::string& heading) {
  const std::size_t first = flags_.size();
  flags_.insert(flags_.end(), more.flags_.begin(), more.flags_.end());
  if (!heading.empty() && first < flags_.size()) flags_[first].heading = heading;
  return *this;
}

FlagTable& FlagTable::add(FlagSpec flag) {
  flags_.push_back(std::move(flag));
  return *this;
}

std::set<std::string> FlagTable::value_flags() const {
  std::set<std::string> names;
  for (const FlagSpec& flag : flags_) {
    if (!flag.placeholder.empty()) names.insert(flag.name);
  }
  return names;
}

std::set<std::string> FlagTable::switch_flags() const {
  std::set<std::string> names;
  for (const FlagSpec& flag : flags_) {
    if (flag.placeholder.empty()) names.insert(flag.name);
  }
  return names;
}

std::string FlagTable::help() const {
  std::string text;
  for (const FlagSpec& flag : flags_) {
    if (!flag.heading.empty()) text += "\n" + flag.heading + "\n";
    text += help_line("--" + flag.name + (flag.placeholder.empty() ? "" : " " + flag.placeholder),
                      flag.help);
  }
  return text;
}

Args FlagTable::parse(const std::vector<std::string>& argv) const {
  return Args(argv, value_flags(), switch_flags());
}

std::string help_line(const std::string& flag, const std::string& text) {
  std::string out = "  " + flag;
  if (out.size() + 2 > kHelpFlagColumn) {
    out += "\n";
    out.append(kHelpFlagColumn, ' ');
  } else {
    out.resize(kHelpFlagColumn, ' ');
  }
  const std::string indent(kHelpFlagColumn, ' ');
  bool first = true;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    for (const std::string& line :
         wrapped(text.substr(begin, end - begin), kHelpWidth - kHelpFlagColumn)) {
      out += (first ? "" : indent) + line + "\n";
      first = false;
    }
    begin = end + 1;
  }
  if (first) out += "\n";
  return out;
}

std::string default_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace draftfeed::cli
