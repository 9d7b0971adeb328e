// A small argument parser for the subcommands: positionals, `--flag VALUE`, `--flag=VALUE`,
// boolean `--switch`, and repeatable flags. Unknown flags are an error that names them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"

namespace draftfeed::cli {

class Args {
 public:
  // `value_flags` take a value ("--rows"); `switch_flags` do not ("--json"). Names without dashes.
  // Throws Error(kInvalidArgument) on an unknown flag or a missing value.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
       const std::set<std::string>& switch_flags);

  const std::vector<std::string>& positionals() const { return positionals_; }
  bool has(const std::string& flag) const;
  bool help() const { return help_; }

  std::string str(const std::string& flag, const std::string& fallback) const;
  std::optional<std::string> opt_str(const std::string& flag) const;
  std::vector<std::string> all(const std::string& flag) const;  // every value of a repeated flag
  std::int64_t integer(const std::string& flag, std::int64_t fallback) const;
  std::optional<std::int64_t> opt_integer(const std::string& flag) const;
  double real(const std::string& flag, double fallback) const;

  // The same, checked against the rule of the option the flag sets; the message names the flag as
  // the user typed it ("--threads must be >= 1, got 0"), not the option's name in the library.
  std::int64_t integer(const std::string& flag, std::int64_t fallback, std::int64_t min) const;
  std::optional<std::int64_t> opt_integer(const std::string& flag, std::int64_t min) const;
  double real(const std::string& flag, double fallback, double min) const;  // finite and >= min
  double fraction(const std::string& flag, double fallback) const;          // in (0, 1)

  // The flag's text (else `fallback`) through one of the library's parsers; when the parser refuses
  // it, the error names the flag as typed before the parser's own words (which name the option).
  template <class Parse>
  auto parsed(const std::string& flag, const std::string& fallback, Parse parse) const {
    try {
      return parse(str(flag, fallback));
    } catch (const Error& error) {
      throw Error(error.kind(), "--" + flag + ": " + error.what());
    }
  }

  // Throws unless there are between `min` and `max` positionals; `what` names them for the message.
  void expect_positionals(std::size_t min, std::size_t max, const std::string& what) const;

 private:
  std::vector<std::string> positionals_;
  std::map<std::string, std::vector<std::string>> values_;
  bool help_ = false;
};

}  // namespace draftfeed::cli
