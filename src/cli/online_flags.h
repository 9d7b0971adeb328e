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
#include "flag_table.h"

namespace draftfeed::cli {

// The flags, their help with the defaults of a default-constructed OnlineSourceOptions.
const FlagTable& online_flags();

// OnlineSourceOptions set from the flags (the others at their defaults). The cache folder and the
// dataset are the caller's to set.
OnlineSourceOptions online_options_from(const Args& args);

// The lookahead's flags (the loader runs: `draftfeed bench`), as the two above: --lookahead ROWS,
// --lookahead-next-epoch, --hedge-factor X, --hedge-min-seconds S.
const FlagTable& lookahead_flags();
LookaheadOptions lookahead_options_from(const Args& args);

}  // namespace draftfeed::cli
