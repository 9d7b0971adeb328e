// One element of a row of hidden states stored as bf16, f16 or f32, as a float: the load the batch
// copy and the FP8 quantizer share (inline: it sits in their inner loops).
#pragma once

#include <cstdint>
#include <cstring>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/common/dtype.h"

namespace draftfeed {

template <HiddenDType kSrc>
inline float load_hidden_value(const std::uint8_t* base, std::int64_t i) {
  static_assert(kSrc == HiddenDType::kBF16 || kSrc == HiddenDType::kF16 ||
                kSrc == HiddenDType::kF32);
  if constexpr (kSrc == HiddenDType::kF32) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  } else {
    std::uint16_t v;
    std::memcpy(&v, base + i * 2, 2);
    if constexpr (kSrc == HiddenDType::kBF16) {
      return bf16_to_float(v);
    } else {
      return f16_to_float(v);
    }
  }
}

}  // namespace draftfeed
