// bf16 rows plus uniform training noise into a bf16 or f32 batch (the default training setup): an
// AVX2 kernel for the batch copy's row_uniform (hidden_copy.cc), 8 element pairs (16 values) at a
// time (on a 2-core AMD EPYC (Zen 3), one thread, a row in L1: 4.2 G values/s), instead of GCC's
// auto-vectorisation of the scalar loop.
//
// Per element pair it computes exactly the scalar definition (noise.h, hidden_copy.cc), in the
// lanes of noise_lanes.h (which says how); the source's non-finite values are counted as the
// scalar copy counts them (on the file's bits, not the results): a row keeps the largest magnitude
// it has seen per lane, one max per block, and only a row that has a non-finite value is counted
// again. The last n mod 16 values (the odd last one included) go through the scalar code, and so
// does a row with a NaN std. So the bits and the count are the scalar definition's
// (tests/cpp/batch_noise_bf16_row_test.cc).
#pragma once

#include <cstdint>

#include "draftfeed/batch/vector_store.h"

namespace draftfeed {

// True where the kernels can run (x86 with AVX2, checked at run time).
bool noise_bf16_row_avx2_available();

// `n` bf16 values (little-endian) at `src` plus uniform noise keyed by `key` (noise_token_key)
// with standard scale `std_dev` -> `n` bf16 values at `dst`; any alignment. Returns the number of
// non-finite source values (as the scalar copy counts: on the file's bits, not the results). Only
// where available.
std::int64_t noise_bf16_row_avx2(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                 std::uint32_t key, float std_dev, RowStores stores);

// The same into `n` float32 values at `dst`.
std::int64_t noise_bf16_f32_row_avx2(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                     std::uint32_t key, float std_dev, RowStores stores);

// The same into a bf16 batch with AVX-512 (noise_bf16_row_avx512.cc): 32 values per block, the
// bf16 round by vcvtne2ps2bf16. Available where cpu_has_avx512_kernels() and not switched off
// (avx512_kernels_enabled(), cpu_features.h).
bool noise_bf16_row_avx512_available();
std::int64_t noise_bf16_row_avx512(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                   std::uint32_t key, float std_dev, RowStores stores);

}  // namespace draftfeed
