// Rows without noise: a bit copy (bf16 -> bf16, f32 -> f32) or a cast to bf16 (f16 or f32 ->
// bf16), with the non-finite count fused into the same pass: AVX2 kernels for the batch copy's
// row_plain (hidden_copy.cc), where scalar code would do a memcpy and then a second pass over the
// source for the count, and cast f16 one element at a time (docs/decisions.md: how much slower).
//
// Each computes exactly the scalar definition:
//   copy:        the bits as they are; counted where the exponent is all ones (NaN or Inf);
//   f16 -> bf16: float_to_bf16(f16_to_float(h)) (dtype.h); F16C's conversion is exact as
//                f16_to_float is, and NaN payloads end up the same once float_to_bf16 quiets them
//                (it sets the quiet bit whether or not the conversion did);
//   f32 -> bf16: float_to_bf16(f), round to nearest even, NaN quieted and truncated;
// counted on the source's bits, as the scalar copy counts (tests/cpp/batch_cast_row_test.cc).
// The last n mod 16 values go through the scalar code.
#pragma once

#include <cstdint>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/vector_store.h"

namespace draftfeed {

// True where the kernels can run (x86 with AVX2 and F16C, checked at run time).
bool cast_row_avx2_available();

// `n` values of `dtype` (bf16, f16 or f32) copied bit for bit from `src` to `dst`, any alignment;
// returns the number of non-finite ones. Only where available.
std::int64_t copy_row_avx2(const std::uint8_t* src, DType dtype, std::uint8_t* dst, std::int64_t n,
                           RowStores stores);

// `n` values of `src_dtype` (f16 or f32) -> `n` bf16 values at `dst`, any alignment; returns the
// number of non-finite source values. Only where available.
std::int64_t cast_bf16_row_avx2(const std::uint8_t* src, DType src_dtype, std::uint8_t* dst,
                                std::int64_t n, RowStores stores);

}  // namespace draftfeed
