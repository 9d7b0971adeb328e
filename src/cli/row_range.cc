#include "row_range.h"

#include <exception>

#include "draftfeed/common/error.h"

namespace draftfeed::cli {

RowRange parse_row_range(const std::string& text, std::int64_t n_rows) {
  RowRange range{0, n_rows};
  if (text.empty()) return range;
  const auto colon = text.find(':');
  require(colon != std::string::npos, ErrorKind::kInvalidArgument,
          "--rows wants A:B, got '" + text + "'");
  auto parse = [&](const std::string& part, std::int64_t fallback) {
    if (part.empty()) return fallback;
    std::size_t used = 0;
    std::int64_t value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == part.size() && used > 0, ErrorKind::kInvalidArgument,
            "--rows wants integers A:B, got '" + text + "'");
    return value;
  };
  range.begin = parse(text.substr(0, colon), 0);
  range.end = parse(text.substr(colon + 1), n_rows);
  require(range.begin >= 0 && range.begin <= range.end && range.end <= n_rows,
          ErrorKind::kInvalidArgument,
          "--rows " + text + " is not a range inside the dataset's " + std::to_string(n_rows) +
              " rows");
  return range;
}

}  // namespace draftfeed::cli
