#include "draftfeed/common/dtype.h"

#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

std::optional<DType> dtype_from_torch_name(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  if (name.empty()) return std::nullopt;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16" || name == "fp16" || name == "half") return DType::kF16;
  if (name == "f32" || name == "fp32" || name == "float") return DType::kF32;
  for (const auto& entry : kDTypes) {
    if (entry.torch_name == name) return entry.dtype;
  }
  return std::nullopt;
}

DType parse_torch_dtype(std::string_view name, std::string_view what) {
  const std::optional<DType> dtype = dtype_from_torch_name(name);
  if (!dtype) {
    throw Error(ErrorKind::kInvalidArgument, std::string(what) + ": unknown dtype '" +
                                                 std::string(name) +
                                                 "' (torch's names, e.g. bfloat16 or float32)");
  }
  return *dtype;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

bool dtype_is_integer(DType dtype) {
  switch (dtype) {
    case DType::kU8:
    case DType::kI8:
    case DType::kI16:
    case DType::kU16:
    case DType::kI32:
    case DType::kU32:
    case DType::kI64:
    case DType::kU64:
      return true;
    default:
      return false;
  }
}

bool dtype_is_signed_integer(DType dtype) {
  return dtype == DType::kI8 || dtype == DType::kI16 || dtype == DType::kI32 ||
         dtype == DType::kI64;
}

float f16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x3FFu;
  std::uint32_t out;
  if (exponent == 0x1F) {
    out = sign | 0x7F800000u | (mantissa << 13);  // Inf or NaN (payload kept)
  } else if (exponent != 0) {
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;  // signed zero
  } else {
    // Subnormal: shift the mantissa up until its leading one is the implicit bit.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    out = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float value;
  std::memcpy(&value, &out, sizeof value);
  return value;
}

std::uint16_t float_to_f16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));  // NaN
  }
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow
  if (magnitude < 0x38800000u) {
    // Result is subnormal (or zero): value * 2^24 rounded to nearest even, done in integers.
    if (magnitude < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24 for the inputs that reach here
    const std::uint32_t kept = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebased = magnitude - 0x38000000u;
  const std::uint32_t rounded = rebased + 0xFFFu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

}  // namespace draftfeed
