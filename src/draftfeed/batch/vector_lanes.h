// Lane helpers shared by the batch copy's AVX2 kernels: reading their counters, and the round
// of floats to bf16 and its packing.
#pragma once

#include <cstdint>

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// Source bytes a compute-heavy kernel asks for ahead of where it reads (prefetch_ahead).
inline constexpr std::int64_t kPrefetchBytes = 512;

// Asks for the cache line kPrefetchBytes past `at` if it is still before `end` (the row's end:
// past it lie bytes the copy skips, a layer it does not take). Why: a kernel that spends ~30
// instructions on 32 bytes keeps only a few cache lines of its row in flight in the out-of-order
// window, and the hardware prefetcher alone does not run far enough ahead to hide memory's
// latency (docs/decisions.md: the gain with uniform noise).
inline void prefetch_ahead(const std::uint8_t* at, const std::uint8_t* end) {
  if (at + kPrefetchBytes < end) {
    _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchBytes), _MM_HINT_T0);
  }
}

// The sum of the 16 unsigned 16-bit lanes of `lanes` (a kernel's per-lane non-finite counts).
__attribute__((target("avx2"))) inline std::int64_t sum_u16_lanes(__m256i lanes) {
  alignas(32) std::uint16_t values[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(values), lanes);
  std::int64_t sum = 0;
  for (const std::uint16_t v : values) sum += v;
  return sum;
}

// float_to_bf16 (dtype.h) on 8 floats' bits without its NaN select, the bf16 in the low half of
// each 32-bit lane: round to nearest even by integer adds. Exact for every value but a NaN whose
// low 16 bits are not zero (the round could carry its payload into the exponent and the sign).
__attribute__((target("avx2"))) inline __m256i round_to_bf16_low(__m256i bits) {
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
  return _mm256_srli_epi32(rounded, 16);
}

// 16 bf16 results from the low halves of the 32-bit lanes of `low` (values 0-7) and `high`
// (values 8-15), in order: packus interleaves the 128-bit halves, the permute puts them back.
__attribute__((target("avx2"))) inline __m256i pack_bf16(__m256i low, __m256i high) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0xD8);
}

}  // namespace draftfeed

#endif
