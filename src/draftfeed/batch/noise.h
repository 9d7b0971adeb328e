// Deterministic training noise: a counter-based generator keyed by (seed, epoch, global row) per
// sample and by (token, element) inside it, so a sample gets the same noise whichever thread copies
// it, in whatever order, and again after a resume.
//
//   sample_key = splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ row)
//   token_key  = low 32 bits of splitmix64(sample_key ^ (token * 0x9E3779B97F4A7C15))
// j is an element's index within the token's flattened target layers (l * H + h), x(j) its value.
//
// uniform: one 32-bit draw per element pair k = j / 2 (noise_bits: one multiply-xorshift round);
// its low 16 bits serve the even element, its high 16 bits the odd one:
//   z        = token_key ^ (k * 0x9E3779B9),  z ^= z >> 16,  z *= 0x7FEB352D,  z ^= z >> 15
//   s(2k)    = ((z & 0xFFFF) + 0.5) * 2^-15 - 1                  (noise_signed_low)
//   s(2k+1)  = ((z >> 16) + 0.5) * 2^-15 - 1                     (noise_signed_high)
//   out(j)   = x(j) + s(j) * std
// s takes 65536 values symmetric in (-1, 1), never 0, exact in float32. out is computed in float32
// (the product, then the sum, each rounded: no FMA) and rounded once to the batch dtype. An odd
// last element j = n - 1 takes the low half of its pair's draw.
// gaussian: a 24-bit uniform per element (noise_uniform: two rounds, mix32),
//   u(j)     = (mix32(token_key + j * 0x9E3779B9) >> 8) * 2^-24   (in [0, 1))
// and Box-Muller on each pair (u(j), u(j+1)), j even, with r = sqrt(-2 ln(1 - u(j))):
//   out(j)   = x(j) + std * r * cos(2 pi u(j+1))
//   out(j+1) = x(j+1) + std * r * sin(2 pi u(j+1))
// in float32, rounded once to the batch dtype; an odd last element takes the cos.
// `token` is the token's index in the file (before any preprocess shift), so the EAGLE-3 shift sees
// the same noise on the same element.
#pragma once

#include <cstdint>

#include "draftfeed/common/hash.h"

namespace draftfeed {

inline std::uint64_t noise_sample_key(std::uint64_t seed, std::uint64_t epoch, std::uint64_t row) {
  return splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ row);
}

inline std::uint32_t noise_token_key(std::uint64_t sample_key, std::uint64_t token) {
  return static_cast<std::uint32_t>(splitmix64(sample_key ^ (token * 0x9E3779B97F4A7C15ULL)));
}

// One multiply-xorshift round: enough mixing for training noise (each output bit depends on every
// input bit of the counter and key), and half the vector multiplies of mix32 on the hot path.
inline std::uint32_t noise_bits(std::uint32_t token_key, std::uint32_t counter) {
  std::uint32_t x = token_key ^ (counter * 0x9E3779B9U);
  x ^= x >> 16;
  x *= 0x7FEB352DU;
  x ^= x >> 15;
  return x;
}

// The two symmetric uniform draws in (-1, 1) of one 32-bit draw.
inline float noise_signed_low(std::uint32_t bits) {
  return (static_cast<float>(bits & 0xFFFFU) + 0.5f) * (1.0f / 32768.0f) - 1.0f;
}
inline float noise_signed_high(std::uint32_t bits) {
  return (static_cast<float>(bits >> 16) + 0.5f) * (1.0f / 32768.0f) - 1.0f;
}

// Value j of a row plus its uniform noise, in float32: the definition above for one value (a
// pair's even value takes the low half of its draw, the odd one the high half, an odd last value
// the low half).
inline float uniform_noised(float value, std::uint32_t token_key, std::int64_t j, float std_dev) {
  const std::uint32_t bits = noise_bits(token_key, static_cast<std::uint32_t>(j / 2));
  return value + (j % 2 == 0 ? noise_signed_low(bits) : noise_signed_high(bits)) * std_dev;
}

inline float noise_uniform(std::uint32_t token_key, std::uint32_t element) {
  return static_cast<float>(mix32(token_key + element * 0x9E3779B9U) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace draftfeed
