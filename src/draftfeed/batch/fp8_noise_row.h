// FP8 E4M3 rows dequantized in bf16 plus uniform training noise, into a bf16 or f32 batch (the
// FP8Transfer default with the trainer's noise), in one pass: each 32 codes looked up in the
// row's tables (fp8_lanes.h), their bf16 values noised in registers (noise_lanes.h) and stored.
// The scalar definition adds the noise to exactly the dequantized bf16 values (hidden_copy.cc's
// row_uniform over fp8_dequantize.h's values), so the bits are the same
// (tests/cpp/batch_fp8_noise_row_test.cc). Before it, a row was dequantized into a scratch row
// and noised from there: two passes, and a store and a load of every value in between.
#pragma once

#include <cstdint>

#include "draftfeed/batch/vector_store.h"

namespace draftfeed {

// True where the kernel can run (x86 with AVX2 and F16C, checked at run time).
bool fp8_noise_row_avx2_available();

// `n` codes of one token with scale `scale_bf16` (rounded to bf16) -> `n` values at `dst`, bf16
// or (kF32) float32, each its dequantized value plus uniform noise keyed by `key`
// (noise_token_key) with standard scale `std_dev`. Only for a row the table applies to (a scale
// in [2^-119, 2^118), a std that is not NaN) and without NaN codes, whose values are all finite:
// returns false otherwise (`dst` then partly written), and the caller takes another way.
bool fp8_noise_row_avx2(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                        std::int64_t n, std::uint32_t key, float std_dev, bool f32,
                        RowStores stores);

// The same into a bf16 batch with AVX-512 (fp8_noise_row_avx512.cc): 64 codes per step looked up
// with byte permutes, the noise and the round as noise_bf16_row_avx512. Same contract; available
// where cpu_has_avx512_kernels() and not switched off (avx512_kernels_enabled(), cpu_features.h).
bool fp8_noise_row_avx512_available();
bool fp8_noise_row_avx512(const std::uint8_t* codes, float scale_bf16, std::uint8_t* dst,
                          std::int64_t n, std::uint32_t key, float std_dev, RowStores stores);

}  // namespace draftfeed
