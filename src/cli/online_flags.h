// The command line's flags for the online source (`draftfeed generate`, `bench`, `demo`): one
// place that names them, sets OnlineSourceOptions' fields from them and prints their help, with
// the defaults of a default-constructed OnlineSourceOptions, so the command line and the library
// cannot disagree.
#pragma once

#include <set>
#include <string>

#include "args.h"
#include "draftfeed/source/lookahead_source.h"
#include "draftfeed/source/online_source.h"

namespace draftfeed::cli {

// The flags (without dashes) that take a value, and the switches.
const std::set<std::string>& online_value_flags();
const std::set<std::string>& online_switch_flags();

// Their lines for a usage text, `width` columns for the flag.
std::string online_flags_usage(int width);

// OnlineSourceOptions set from the flags (the others at their defaults). The cache folder and the
// dataset are the caller's to set.
OnlineSourceOptions online_options_from(const Args& args);

// The lookahead's flags (the loader runs: `draftfeed bench`), as the three above: --lookahead ROWS,
// --lookahead-next-epoch, --hedge-factor X, --hedge-min-seconds S.
const std::set<std::string>& lookahead_value_flags();
const std::set<std::string>& lookahead_switch_flags();
std::string lookahead_flags_usage(int width);
LookaheadOptions lookahead_options_from(const Args& args);

// `value` as a help text writes a default: "120", "0.1", "2".
std::string default_text(double value);

}  // namespace draftfeed::cli
