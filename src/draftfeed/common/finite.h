// Finiteness of floating-point tensors: a fast yes/no scan over a whole buffer, and a slower count
// of NaN and Inf values per layer slot that only runs once the fast scan has found something.
//
// The fast scan is a bit test on the exponent field (all ones means Inf or NaN), vectorised (SSE2
// baseline, AVX2 picked at run time), so a file is checked at memory bandwidth. Elements may be
// unaligned: the kernels use unaligned loads. Integer and BOOL dtypes are always finite.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

// True when `dtype`'s values can be NaN or Inf and this module knows how to check them
// (BF16, F16, F32, F64, and F8_E4M3, which has NaN codes but no infinities).
bool finite_scan_supports(DType dtype);

// Which implementation of the scan to use; kAuto is the fastest this CPU has. Tests and
// benchmarks name one to check them all; one this CPU lacks falls back to the next slower.
enum class FiniteKernel { kAuto, kScalar, kSse2, kAvx2 };

// True when none of the `count` elements at `data` is NaN or Inf. Types the scan does not support
// (integers, BOOL, the other F8 types, ...) return true. `kernel` applies to the 16- and 32-bit
// types; F8_E4M3 is a byte loop the compiler vectorises.
bool all_finite(const void* data, std::size_t count, DType dtype,
                FiniteKernel kernel = FiniteKernel::kAuto);

struct NonFiniteCounts {
  std::int64_t nan = 0;
  std::int64_t inf = 0;
  std::int64_t total() const { return nan + inf; }
};

// Counts NaN and Inf elements of a `[rows, slots, width]` tensor per slot (for hidden states: per
// captured layer). Returns `slots` entries.
std::vector<NonFiniteCounts> count_nonfinite_per_slot(const void* data, std::int64_t rows,
                                                      std::int64_t slots, std::int64_t width,
                                                      DType dtype);
// The same into `out` (`slots` entries, zeroed first); allocates nothing (fault_guard.h).
void count_nonfinite_per_slot(const void* data, std::int64_t rows, std::int64_t slots,
                              std::int64_t width, DType dtype, std::span<NonFiniteCounts> out);

// The kernel `all_finite` uses on this machine: "avx2", "sse2" or "scalar".
std::string_view finite_scan_kernel();

}  // namespace draftfeed
