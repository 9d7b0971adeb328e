#include "args.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "draftfeed/common/error.h"

namespace draftfeed::cli {

namespace {

Error bad(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
           const std::set<std::string>& switch_flags) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word == "-h" || word == "--help") {
      help_ = true;
      continue;
    }
    if (word.size() < 3 || word.rfind("--", 0) != 0) {
      positionals_.push_back(word);
      continue;
    }
    std::string name = word.substr(2);
    std::optional<std::string> inline_value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switch_flags.count(name) != 0) {
      if (inline_value) throw bad("--" + name + " takes no value");
      values_[name].push_back("1");
    } else if (value_flags.count(name) != 0) {
      if (inline_value) {
        values_[name].push_back(*inline_value);
      } else {
        if (i + 1 >= argv.size()) throw bad("--" + name + " needs a value");
        values_[name].push_back(argv[++i]);
      }
    } else {
      throw bad("unknown option --" + name + " (see --help)");
    }
  }
}

bool Args::has(const std::string& flag) const { return values_.count(flag) != 0; }

std::optional<std::string> Args::opt_str(const std::string& flag) const {
  const auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

std::string Args::str(const std::string& flag, const std::string& fallback) const {
  return opt_str(flag).value_or(fallback);
}

std::vector<std::string> Args::all(const std::string& flag) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::optional<std::int64_t> Args::opt_integer(const std::string& flag) const {
  const auto text = opt_str(flag);
  if (!text) return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) {
    throw bad("--" + flag + " wants an integer, got '" + *text + "'");
  }
  return value;
}

std::int64_t Args::integer(const std::string& flag, std::int64_t fallback) const {
  return opt_integer(flag).value_or(fallback);
}

double Args::real(const std::string& flag, double fallback) const {
  const auto text = opt_str(flag);
  if (!text) return fallback;
  try {
    std::size_t used = 0;
    const double value = std::stod(*text, &used);
    if (used == text->size()) return value;
  } catch (const std::exception&) {
  }
  throw bad("--" + flag + " wants a number, got '" + *text + "'");
}

std::optional<std::int64_t> Args::opt_integer(const std::string& flag, std::int64_t min) const {
  const auto value = opt_integer(flag);
  if (value && *value < min) {
    throw bad("--" + flag + " must be >= " + std::to_string(min) + ", got " +
              std::to_string(*value));
  }
  return value;
}

std::int64_t Args::integer(const std::string& flag, std::int64_t fallback, std::int64_t min) const {
  return opt_integer(flag, min).value_or(fallback);
}

double Args::real(const std::string& flag, double fallback, double min) const {
  const double value = real(flag, fallback);
  if (has(flag) && !(std::isfinite(value) && value >= min)) {
    throw bad("--" + flag + " must be a finite number >= " + number_text(min) + ", got " +
              *opt_str(flag));
  }
  return value;
}

double Args::fraction(const std::string& flag, double fallback) const {
  const double value = real(flag, fallback);
  if (has(flag) && !(value > 0.0 && value < 1.0)) {
    throw bad("--" + flag + " must be in (0, 1), got " + *opt_str(flag));
  }
  return value;
}

void Args::expect_positionals(std::size_t min, std::size_t max, const std::string& what) const {
  if (positionals_.size() < min || positionals_.size() > max) {
    throw bad("expected " + what + ", got " + std::to_string(positionals_.size()) + " argument(s)");
  }
}

}  // namespace draftfeed::cli
