// Element types of tensors, by their safetensors names, and the scalar conversions between the
// floating-point types hidden states come in (bf16, f16, f32).
//
// The enum's order is the order the safetensors package declares its dtypes in; its writer sorts
// tensors by that order (descending), so our writer can lay files out byte for byte as it does.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace draftfeed {

enum class DType : std::uint8_t {
  kBool,
  kF4,
  kF6E2M3,
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kF8E4M3Fnuz,
  kF8E5M2Fnuz,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

// The safetensors name ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// The dtype with that exact (case-sensitive) safetensors name, or nothing.
std::optional<DType> dtype_from_name(std::string_view name);
// Size of one element in bits (4 for F4, 6 for the F6 types, 8 * bytes otherwise).
unsigned dtype_bits(DType dtype);
bool dtype_is_integer(DType dtype);  // BOOL is not an integer here
bool dtype_is_signed_integer(DType dtype);

// ---- scalar conversions (no NaN canonicalisation beyond what is stated) ----

inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// `a` where `condition` holds, else `b`, as bit masks rather than a branch: loops of these
// vectorise (GCC does not if-convert a chain of conditional returns or of several selects).
inline std::uint32_t select_bits(bool condition, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

// Round to nearest, ties to even, as torch does; a NaN stays a (quiet) NaN.
inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  const std::uint32_t quiet_nan = bits | 0x00400000u;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<std::uint16_t>(select_bits(nan, quiet_nan, rounded) >> 16);
}

// IEEE binary16 <-> binary32, round to nearest even, subnormals kept.
float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);

}  // namespace draftfeed
