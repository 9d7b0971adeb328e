// The DLPack element type of a tensor of draftfeed's DType, for the tensors the module hands to
// torch (a batch's, a packed batch's): bf16 as bfloat, not as its raw bits.
#pragma once

#include <nanobind/ndarray.h>

#include "draftfeed/common/dtype.h"

namespace draftfeed::python {

namespace nb = nanobind;

inline nb::dlpack::dtype dlpack_of(DType dtype) {
  using Code = nb::dlpack::dtype_code;
  auto make = [](Code code, unsigned bits) {
    return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (dtype) {
    case DType::kBool:
      return make(Code::Bool, 8);
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      return make(Code::Int, dtype_bits(dtype));
    case DType::kU8:
    case DType::kU16:
    case DType::kU32:
    case DType::kU64:
      return make(Code::UInt, dtype_bits(dtype));
    case DType::kBF16:
      return make(Code::Bfloat, 16);
    default:
      return make(Code::Float, dtype_bits(dtype));
  }
}

}  // namespace draftfeed::python
