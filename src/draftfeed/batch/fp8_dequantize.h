// hs-connectors' FP8 dequantize, one element at a time: the scalar definition the batch copy
// (hidden_copy.cc) is built from and checked against.
//
// FP8Transfer restores `hidden_states` as `fp8.to(D) * scales.to(D)` with D its `dequantize_dtype`
// (bf16 by default, f16 or f32): both operands are first converted to D, then multiplied in D.
// PyTorch multiplies bf16 and f16 tensors on the CPU by widening both to float, multiplying, and
// rounding the product once to D (to nearest, ties to even). So, per element of token t:
//
//   scale_D = round_D(scale[t])                  (f32 -> D; the identity for f32)
//   value   = round_D(float(code) x scale_D)     (float(code) is exact: common/fp8.h)
//
// float(code) is exact in every D (E4M3's 4 significant bits fit; its range fits f16's), and the
// float product of a 4-bit and an 8- or 11-bit significand is exact unless it leaves float's normal
// range, where float's own rounding happens first, as it does in PyTorch. NaN codes give NaN;
// a product too large for D gives Inf (the batch copy counts both as non-finite).
#pragma once

#include <cstdint>
#include <vector>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fp8.h"

namespace draftfeed {

// `value` rounded to the dequantize dtype D, as a float (the identity for f32).
template <DType kD>
inline float round_to_dtype(float value) {
  static_assert(kD == DType::kBF16 || kD == DType::kF16 || kD == DType::kF32,
                "FP8Transfer dequantizes into bf16, f16 or f32");
  if constexpr (kD == DType::kBF16) {
    return bf16_to_float(float_to_bf16(value));
  } else if constexpr (kD == DType::kF16) {
    return f16_to_float(float_to_f16(value));
  } else {
    return value;
  }
}

// One element: `scale_in_d` is the token's scale already rounded to D (round_to_dtype<kD>), done
// once per token rather than per element.
template <DType kD>
inline float dequantize_fp8(std::uint8_t code, float scale_in_d) {
  return round_to_dtype<kD>(fp8_e4m3_to_float(code) * scale_in_d);
}

// The same with D chosen at run time, from the raw float32 scale: for tests and tools.
inline float dequantize_fp8(std::uint8_t code, float scale, DType dequantize) {
  switch (dequantize) {
    case DType::kBF16:
      return dequantize_fp8<DType::kBF16>(code, round_to_dtype<DType::kBF16>(scale));
    case DType::kF16:
      return dequantize_fp8<DType::kF16>(code, round_to_dtype<DType::kF16>(scale));
    default:  // f32 (another dtype is not a dequantize dtype: refused where D is chosen)
      break;
  }
  return dequantize_fp8<DType::kF32>(code, scale);
}

// A whole [tokens, per_token] FP8 tensor dequantized into D's own bytes (bf16 or f16 bits, f32),
// little-endian: for the per-sample Python paths, which hand tensors to a user's callable.
// `scales` holds `tokens` float32 values (any alignment).
std::vector<std::uint8_t> dequantize_fp8_tensor(const std::uint8_t* codes,
                                                const std::uint8_t* scales, std::int64_t tokens,
                                                std::int64_t per_token, DType dequantize);

}  // namespace draftfeed
