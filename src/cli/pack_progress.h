// The progress bar of `draftfeed pack` and `draftfeed unpack`: runs `work` on a thread of its own
// and, when `show`, redraws rows done and bytes before -> after on stderr every 200 ms until it
// ends. Exceptions from `work` are rethrown here.
#pragma once

#include <cstdint>
#include <functional>

#include "draftfeed/pack/pack_writer.h"

namespace draftfeed::cli {

void run_with_progress(const char* verb, std::int64_t total, bool show, PackProgress& progress,
                       const std::function<void()>& work);

// "1.234 GB"
std::string gigabytes(double bytes);

}  // namespace draftfeed::cli
