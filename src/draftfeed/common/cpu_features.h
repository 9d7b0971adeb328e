// What the CPU this process runs on can do, checked once, for kernels chosen at run time.
#pragma once

namespace draftfeed {

// x86 with AVX2 (and an OS that saves the ymm registers); false elsewhere.
bool cpu_has_avx2();

// x86 with BMI2 (shifts by a register other than CL, which the Huffman decoder's loop is made of);
// false elsewhere.
bool cpu_has_bmi2();

// AVX2 and F16C (the f16 <-> float conversions).
bool cpu_has_avx2_f16c();

// The AVX-512 subsets the batch copy's 512-bit kernels use (AVX512_KERNEL_TARGET below): F, BW,
// DQ, VL, VBMI (byte permutes) and BF16 (float -> bf16 conversion), with an OS that saves the zmm
// and mask registers. Intel Cooper Lake / Sapphire Rapids and later, AMD Zen 4 and later.
bool cpu_has_avx512_kernels();

// Whether the batch copy takes its AVX-512 kernels where the CPU has them: yes unless the
// environment says DRAFTFEED_AVX512=0 (for a CPU that slows its clock on 512-bit code) or
// set_avx512_kernels_allowed(false) was called (the kernels benchmark, to time AVX2 beside them;
// tests, to run the batch copy both ways), which returns what was allowed before.
bool avx512_kernels_enabled();
bool set_avx512_kernels_allowed(bool allowed);

}  // namespace draftfeed

// The target of every function built with AVX-512 instructions (a callee's must be a subset of
// its caller's, so the kernels and their lane helpers share this one).
#define DRAFTFEED_AVX512_TARGET "avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16"
