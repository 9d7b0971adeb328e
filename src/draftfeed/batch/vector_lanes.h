// Reading the lanes of the batch copy's AVX2 kernels' counters.
#pragma once

#include <cstdint>

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// The sum of the 16 unsigned 16-bit lanes of `lanes` (a kernel's per-lane non-finite counts).
__attribute__((target("avx2"))) inline std::int64_t sum_u16_lanes(__m256i lanes) {
  alignas(32) std::uint16_t values[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(values), lanes);
  std::int64_t sum = 0;
  for (const std::uint16_t v : values) sum += v;
  return sum;
}

}  // namespace draftfeed

#endif
