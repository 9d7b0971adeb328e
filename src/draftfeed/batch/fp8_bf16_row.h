// FP8 E4M3 rows dequantized in bf16 into a bf16 batch without noise (the default FP8Transfer
// setup): an AVX2 kernel computing each element directly, 16 at a time, instead of the batch
// copy's per-token table, whose lookups are a scalar load per element (measured on a 2-core AMD
// EPYC, one thread, warm rows: 4.0 G values/s against the table's 1.8 G).
//
// Per element it computes exactly the scalar definition (fp8_dequantize.h):
//   bf16 bits = float_to_bf16(fp8_e4m3_to_float(code) x scale_bf16)
// Each code is moved into f16's layout, where it reads as code x 2^-8 exactly (subnormal codes
// included, NaN codes made f16 NaNs), F16C converts that to float exactly, one float multiply by
// scale x 2^8 gives the same correctly rounded product (the real product is the same; for scales
// from 2^119, where scale x 2^8 could overflow, two multiplies: by 2^8, then by the scale), and
// the round to bf16 is float_to_bf16's integer round-to-nearest-even. So the bits are the same as
// the scalar definition's, NaNs included (tests/cpp/batch_fp8_bf16_row_test.cc). No float
// subnormal is ever an operand unless the scale is one. A row without NaN codes whose scale is
// below 2^118 (nearly every row: hs-connectors' scales are max|x| / 448) cannot have a non-finite
// result, so it skips the NaN select and the count (a scan for NaN codes, 32 per step, decides).
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
