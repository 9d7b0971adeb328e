// Integer mixers shared by the deterministic generators (training noise, synthetic data).
#pragma once

#include <cstdint>

namespace draftfeed {

// SplitMix64's output function (its finaliser): a bijection with full avalanche.
inline std::uint64_t splitmix64_finalizer(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// SplitMix64's step: the finaliser applied to z + golden ratio.
inline std::uint64_t splitmix64(std::uint64_t x) {
  return splitmix64_finalizer(x + 0x9E3779B97F4A7C15ULL);
}

// A 32-bit bijective mixer with low bias (two multiply-xorshift rounds); vectorises with 32-bit
// lanes.
inline std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352DU;
  x ^= x >> 15;
  x *= 0x846CA68BU;
  x ^= x >> 16;
  return x;
}

}  // namespace draftfeed
