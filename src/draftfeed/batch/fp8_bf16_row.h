// FP8 E4M3 rows dequantized in bf16 into a bf16 batch without noise (the default FP8Transfer
// setup): an AVX2 kernel instead of the batch copy's per-token table, whose lookups are a scalar
// load per element.
//
// Per element it gives exactly the scalar definition (fp8_dequantize.h):
//   bf16 bits = float_to_bf16(fp8_e4m3_to_float(code) x scale_bf16)
// Direct computation, 16 at a time: each code is moved into f16's layout, where it reads as code x
// 2^-8 exactly (subnormal codes included, NaN codes made f16 NaNs), F16C converts that to float
// exactly, one float multiply by scale x 2^8 gives the same correctly rounded product (the real
// product is the same; for scales from 2^119, where scale x 2^8 could overflow, two multiplies: by
// 2^8, then by the scale), and the round to bf16 is float_to_bf16's integer round-to-nearest-even.
// No float subnormal is ever an operand unless the scale is one.
// Table lookups, 32 at a time, for a row without NaN codes whose scale is in [2^-119, 2^118)
// (nearly every row: hs-connectors' scales are max|x| / 448): no result can be non-finite or a
// bf16 subnormal, so a code's result is one of 32 computed directly per row, by its low 4 bits,
// with its exponent's upper bits added to the bf16 exponent (fp8_bf16_row.cc says why that is
// exact); vpshufb looks up 32 codes per instruction, far fewer instructions than the direct form
// (`draftfeed kernels` compares them: docs/decisions.md). So the bits are the scalar definition's,
// NaNs included (tests/cpp/batch_fp8_bf16_row_test.cc).
#pragma once

#include <cstdint>

#include "draftfeed/batch/vector_store.h"

namespace draftfeed {

// True where the kernel can run (x86 with AVX2 and F16C, checked at run time).
bool fp8_bf16_row_avx2_available();

// `n` codes of one token -> `n` bf16 values (little-endian) at `dst`, any alignment. `scale_bf16`
// is the token's scale already rounded to bf16 (round_to_dtype<kBF16>). Returns the number of
// non-finite results (NaN codes, products too large for bf16). Only where available. `stores`:
// vector_store.h.
std::int64_t fp8_bf16_row_avx2(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                               std::int64_t n, RowStores stores);

}  // namespace draftfeed
