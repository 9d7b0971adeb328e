// The 8-bit float hidden states are quantized to: float8 E4M3 "fn" (the OCP FP8 E4M3 format,
// torch's float8_e4m3fn, safetensors' F8_E4M3).
//
//   bit 7: sign; bits 6-3: exponent, bias 7; bits 2-0: mantissa.
//   exponent 1..15: (-1)^s x 2^(e-7) x (1 + m/8)   (largest finite: 0x7E = 448)
//   exponent 0:     (-1)^s x 2^-6 x m/8 = m x 2^-9  (subnormals; 0x00 and 0x80 are +0 and -0)
//   0x7F and 0xFF:  NaN. There are no infinities ("fn" = finite).
//
// Both conversions are written from that definition (our own code; torch is only the oracle the
// tests compare with, for every code and for float inputs around every rounding boundary). They
// are scalar references: the batch kernels build on fp8_e4m3_to_float, whose branch-free form is
// what the compiler vectorises.
#pragma once

#include <cstdint>
#include <cstring>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

// The largest finite E4M3 value, torch.finfo(torch.float8_e4m3fn).max.
inline constexpr float kFp8E4M3Max = 448.0f;

// The dtypes FP8 values are dequantized into, as FP8Transfer's dequantize_dtype: bf16, f16, f32.
constexpr bool is_fp8_dequantize_dtype(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32;
}

// True for the two NaN codes.
constexpr bool fp8_e4m3_is_nan(std::uint8_t code) { return (code & 0x7Fu) == 0x7Fu; }

// The exact float value of a code (every E4M3 value is a float). NaN codes give a quiet NaN with
// the code's sign.
inline float fp8_e4m3_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t magnitude = code & 0x7Fu;
  // Normal codes: the exponent is rebiased (7 -> 127) and the 3 mantissa bits become the top of
  // float's 23, i.e. the code's magnitude shifted up by 20 bits plus (127 - 7) in the exponent.
  const std::uint32_t normal = (magnitude << 20) + (120u << 23);
  // Subnormal codes (exponent field 0): m x 2^-9, exact in float.
  const float subnormal = static_cast<float>(magnitude) * 0x1p-9f;
  std::uint32_t subnormal_bits;
  std::memcpy(&subnormal_bits, &subnormal, sizeof subnormal_bits);
  std::uint32_t bits = select_bits(magnitude < 8u, subnormal_bits, normal);
  bits = select_bits(magnitude == 0x7Fu, 0x7FC00000u, bits) | sign;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// `value` rounded to the nearest E4M3 value, ties to even. Magnitudes past the largest finite
// value (infinities included) saturate to +-448 and NaN gives NaN (0x7F with the input's sign
// bit), as torch's float -> float8_e4m3fn cast does (torch 2.13, the tests' oracle; some older
// versions gave NaN from 480 up). A quantizer never gets there: |x / scale| <= 448 up to one
// rounding. Subnormal results are rounded, not flushed.
std::uint8_t float_to_fp8_e4m3(float value);

}  // namespace draftfeed
