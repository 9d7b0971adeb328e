// `--rows A:B` for the commands that walk a dataset's rows (generate, quantize).
#pragma once

#include <cstdint>
#include <string>

namespace draftfeed::cli {

struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// "A:B" (either side may be left out) inside [0, n_rows); "" is every row. Throws
// Error(kInvalidArgument) naming the text.
RowRange parse_row_range(const std::string& text, std::int64_t n_rows);

}  // namespace draftfeed::cli
