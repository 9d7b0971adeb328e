#include "draftfeed/common/fp8.h"

namespace draftfeed {

namespace {

// `kept + 1` when the dropped bits `rest` (of `shift` bits) are more than half an ulp, or exactly
// half with `kept` odd: round to nearest, ties to even.
std::uint32_t round_half_even(std::uint32_t kept, std::uint32_t rest, std::uint32_t shift) {
  const std::uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u) != 0)) ? 1u : 0u);
}

}  // namespace

std::uint8_t float_to_fp8_e4m3(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  constexpr std::uint8_t kNaN = 0x7F;
  constexpr std::uint8_t kLargest = 0x7E;  // 448
  constexpr std::uint32_t kInfinity = 0x7F800000u;
  constexpr std::uint32_t k464 = 0x43E80000u;             // halfway between 448 and 480
  constexpr std::uint32_t kSmallestNormal = 0x3C800000u;  // 2^-6
  if (magnitude > kInfinity) return static_cast<std::uint8_t>(sign | kNaN);
  // Everything that would round past 448 (to 480, whose code 0x7F is NaN) saturates; 464 itself
  // ties to 448, the even neighbour.
  if (magnitude > k464) return static_cast<std::uint8_t>(sign | kLargest);
  const std::uint32_t exponent = magnitude >> 23;  // biased by 127
  const std::uint32_t mantissa = magnitude & 0x7FFFFFu;
  std::uint32_t code;
  if (magnitude >= kSmallestNormal) {
    // Normal: keep the top 3 mantissa bits of 23; a carry out of them moves into the exponent, as
    // it should (never up to 0x7F: magnitudes above 464 were saturated above).
    const std::uint32_t kept = ((exponent - 120u) << 3) | (mantissa >> 20);
    code = round_half_even(kept, mantissa & 0xFFFFFu, 20u);
  } else if (exponent == 0) {
    code = 0;  // float subnormals are below 2^-126: far under half the smallest E4M3 subnormal
  } else {
    // Subnormal result: |value| x 2^9 rounded to an integer (0..8; 8 is the code of 2^-6).
    // |value| = M x 2^(exponent - 150) with the 24-bit significand M, so the integer is
    // M >> (141 - exponent), rounded.
    const std::uint32_t significand = mantissa | 0x800000u;
    const std::uint32_t shift = 141u - exponent;  // >= 21 here
    if (shift > 25u) {
      code = 0;  // M < 2^24 is below half of 2^shift
    } else {
      code = round_half_even(significand >> shift, significand & ((1u << shift) - 1u), shift);
    }
  }
  return static_cast<std::uint8_t>(sign | code);
}

}  // namespace draftfeed
