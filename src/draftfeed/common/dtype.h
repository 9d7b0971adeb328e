// Element types, the one enum every stage uses: tensors in safetensors files (by the safetensors
// names), hidden states in files and in batches, a batch's tensors; their names (the safetensors
// package's and torch's) and sizes, and the scalar conversions between the floating-point types
// hidden states come in (bf16, f16, f32). F8 E4M3 (fp8.h) is a file type only: its values come
// with one scale per token and are dequantized into a batch's bf16 or f32.
//
// The enum's order is the order the safetensors package declares its dtypes in; its writer sorts
// tensors by that order (descending), so our writer can lay files out byte for byte as it does.
#pragma once

#include <array>
#include <cstddef>
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

struct DTypeInfo {
  DType dtype;
  std::string_view name;        // the safetensors name
  std::string_view torch_name;  // torch's (`torch.<name>`); empty where torch has none
  unsigned bits;
};

// In enum order, so the table is indexed by the enum's value.
inline constexpr std::array<DTypeInfo, 22> kDTypes = {{
    {DType::kBool, "BOOL", "bool", 8},
    {DType::kF4, "F4", "", 4},
    {DType::kF6E2M3, "F6_E2M3", "", 6},
    {DType::kF6E3M2, "F6_E3M2", "", 6},
    {DType::kU8, "U8", "uint8", 8},
    {DType::kI8, "I8", "int8", 8},
    {DType::kF8E5M2, "F8_E5M2", "float8_e5m2", 8},
    {DType::kF8E4M3, "F8_E4M3", "float8_e4m3fn", 8},
    {DType::kF8E8M0, "F8_E8M0", "float8_e8m0fnu", 8},
    {DType::kF8E4M3Fnuz, "F8_E4M3FNUZ", "float8_e4m3fnuz", 8},
    {DType::kF8E5M2Fnuz, "F8_E5M2FNUZ", "float8_e5m2fnuz", 8},
    {DType::kI16, "I16", "int16", 16},
    {DType::kU16, "U16", "uint16", 16},
    {DType::kF16, "F16", "float16", 16},
    {DType::kBF16, "BF16", "bfloat16", 16},
    {DType::kI32, "I32", "int32", 32},
    {DType::kU32, "U32", "uint32", 32},
    {DType::kF32, "F32", "float32", 32},
    {DType::kC64, "C64", "complex64", 64},
    {DType::kF64, "F64", "float64", 64},
    {DType::kI64, "I64", "int64", 64},
    {DType::kU64, "U64", "uint64", 64},
}};

// A value outside the enum (a corrupt view) reads as this: no name, no size.
inline constexpr DTypeInfo kUnknownDType = {DType::kBool, "unknown", "unknown", 0};
constexpr const DTypeInfo& dtype_info(DType dtype) {
  const auto index = static_cast<std::size_t>(dtype);
  return index < kDTypes.size() ? kDTypes[index] : kUnknownDType;
}
// The safetensors name ("BF16", "F8_E4M3", ...).
constexpr std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }
// torch's name ("bfloat16", "float8_e4m3fn", ...), for messages and the Python side.
constexpr const char* torch_dtype_name(DType dtype) { return dtype_info(dtype).torch_name.data(); }
// Size of one element in bits (4 for F4, 6 for the F6 types, 8 * bytes otherwise; 0 outside the
// enum).
constexpr unsigned dtype_bits(DType dtype) { return dtype_info(dtype).bits; }
// Size of one element in bytes (0 for the sub-byte types F4 and F6).
constexpr std::size_t dtype_size(DType dtype) { return dtype_bits(dtype) / 8; }

// The dtype with that exact (case-sensitive) safetensors name, or nothing.
std::optional<DType> dtype_from_name(std::string_view name);
// The dtype of a torch name, with or without "torch." ("bfloat16", "torch.float32", what str()
// of a torch dtype gives), or of the usual short names ("bf16", "f16", "fp16", "half", "f32",
// "fp32", "float"), or nothing. The one parser of the dtype names users write.
std::optional<DType> dtype_from_torch_name(std::string_view name);
// The same, throwing Error(kInvalidArgument) naming `what` (the setting) and the text.
DType parse_torch_dtype(std::string_view name, std::string_view what);
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
