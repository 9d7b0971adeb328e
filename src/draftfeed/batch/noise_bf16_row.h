// bf16 rows plus uniform training noise into a bf16 or f32 batch (the default training setup): an
// AVX2 kernel for the batch copy's row_uniform (hidden_copy.cc), 8 element pairs (16 values) at a
// time, instead of GCC's auto-vectorisation of the scalar loop (measured on a 2-core AMD EPYC
// (Zen 3), one thread, 96 MiB of bf16 rows: 3.4 G values/s against 1.55 G, memcpy 3.9 G).
//
// Per element pair k it computes exactly the scalar definition (noise.h, hidden_copy.cc):
//   bits = noise_bits(key, k)            (vpmulld; counter x 0x9E3779B9 stepped by an add instead)
//   out(2k)     = round(a(2k)     + noise_signed_low(bits)  x std)
//   out(2k + 1) = round(a(2k + 1) + noise_signed_high(bits) x std)
// A draw is (u - 32767.5) 2^-15 for a 16-bit half u: the kernel makes (u - 32767.5) 2^16 with
// integer ops (exact in float32) and multiplies it by std x 2^-31, whose product has the same real
// value, so the same float32 rounding, as draw x std (for |std| < 2^-95, where std x 2^-31 would
// be subnormal and inexact, the draw is first made exactly and multiplied by std). The product and
// the sum are two separately rounded float32 operations, as in the scalar code: no FMA (the
// kernel's target does not enable it, so the compiler cannot contract them either). A bf16 pair
// is one 32-bit word, whose low half shifted up and high half masked are the two values as floats
// exactly. The round to bf16 is float_to_bf16's integer round-to-nearest-even (its NaN select is
// not needed: see round_bf16_high); f32 results are stored as they are. So the bits are the scalar
// definition's (tests/cpp/batch_noise_bf16_row_test.cc). The last n mod 16 values (the odd last
// one included) go through the scalar code, and so does a row with a NaN std.
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

}  // namespace draftfeed
