// One element of a row of hidden states stored as bf16, f16 or f32, as a float, and whether its
// bits are non-finite; one value stored into a bf16 or f32 batch: what the batch copy, its
// kernels' scalar tails and the FP8 quantizer share (inline: it sits in their inner loops).
#pragma once

#include <cstdint>
#include <cstring>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

template <DType kSrc>
inline float load_hidden_value(const std::uint8_t* base, std::int64_t i) {
  static_assert(kSrc == DType::kBF16 || kSrc == DType::kF16 || kSrc == DType::kF32);
  if constexpr (kSrc == DType::kF32) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  } else {
    std::uint16_t v;
    std::memcpy(&v, base + i * 2, 2);
    if constexpr (kSrc == DType::kBF16) {
      return bf16_to_float(v);
    } else {
      return f16_to_float(v);
    }
  }
}

// NaN or Inf, read on the element's bits (exponent all ones).
template <DType kSrc>
inline bool hidden_value_nonfinite(const std::uint8_t* base, std::int64_t i) {
  static_assert(kSrc == DType::kBF16 || kSrc == DType::kF16 || kSrc == DType::kF32);
  if constexpr (kSrc == DType::kF32) {
    std::uint32_t v;
    std::memcpy(&v, base + i * 4, 4);
    return (v & 0x7F800000U) == 0x7F800000U;
  } else {
    std::uint16_t v;
    std::memcpy(&v, base + i * 2, 2);
    constexpr std::uint16_t kMask = kSrc == DType::kBF16 ? 0x7F80 : 0x7C00;
    return (v & kMask) == kMask;
  }
}

// The non-finite values among the first `n` at `base`, counted on their bits.
template <DType kSrc>
inline std::int64_t count_nonfinite_values(const std::uint8_t* base, std::int64_t n) {
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) count += hidden_value_nonfinite<kSrc>(base, i);
  return count;
}

// `value` stored as element i of a batch row of kDst (bf16: rounded to nearest even).
template <DType kDst>
inline void store_hidden_value(std::uint8_t* base, std::int64_t i, float value) {
  static_assert(kDst == DType::kBF16 || kDst == DType::kF32);
  if constexpr (kDst == DType::kF32) {
    std::memcpy(base + i * 4, &value, 4);
  } else {
    const std::uint16_t v = float_to_bf16(value);
    std::memcpy(base + i * 2, &v, 2);
  }
}

}  // namespace draftfeed
