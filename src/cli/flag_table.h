// A command's flags, declared once: the parser's value and switch flags (Args) and the lines of its
// --help are made from the same table, so a flag the command takes is a flag its help shows, in
// the one layout every command shares (the flag and its placeholder, then the text at a fixed
// column, or on the lines below when the flag is too long for the column; long text wrapped).
// Groups of flags that several commands take (the online source's, a cache rewrite's) are tables
// of their own, added to a command's.
#pragma once

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "args.h"

namespace draftfeed::cli {

struct FlagSpec {
  std::string name;         // without dashes: "shard-bytes"
  std::string placeholder;  // what the value is in the help ("N", "DIR"); empty: a switch
  std::string help;         // one paragraph; "\n" starts a new line of it
  // Printed before the flag: a heading line of its group ("online (...):"), empty for none.
  std::string heading = {};
};

class FlagTable {
 public:
  FlagTable() = default;
  FlagTable(std::initializer_list<FlagSpec> flags) : flags_(flags) {}

  // This table, then `more`'s flags (a shared group), under `heading` when given.
  FlagTable& add(const FlagTable& more, const std::string& heading = {});
  FlagTable& add(FlagSpec flag);

  std::set<std::string> value_flags() const;
  std::set<std::string> switch_flags() const;
  // The option lines, in declaration order.
  std::string help() const;
  // Parses `argv` against this table (Args: unknown flags are errors naming them).
  Args parse(const std::vector<std::string>& argv) const;

 private:
  std::vector<FlagSpec> flags_;
};

// The help's layout: the text column, and the width text is wrapped to.
inline constexpr std::size_t kHelpFlagColumn = 24;
inline constexpr std::size_t kHelpWidth = 100;

// One option line: "  FLAG" padded to the column, then `text` wrapped to kHelpWidth (continuation
// lines at the column); FLAG on a line of its own when it does not leave two spaces before the
// column.
std::string help_line(const std::string& flag, const std::string& text);

// `value` as a help text writes a default: "120", "0.1", "2".
std::string default_text(double value);

}  // namespace draftfeed::cli
