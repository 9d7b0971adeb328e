// Wall-clock helpers of the commands that time what they run (demo, bench's progress, kernels,
// codecs): one definition of each.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace draftfeed::cli {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The median of `values` (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 != 0 ? values[mid] : (values[mid - 1] + values[mid]) / 2.0;
}

}  // namespace draftfeed::cli
