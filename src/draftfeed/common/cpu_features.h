// What the CPU this process runs on can do, checked once, for kernels chosen at run time.
#pragma once

namespace draftfeed {

// x86 with AVX2 (and an OS that saves the ymm registers); false elsewhere.
bool cpu_has_avx2();

// AVX2 and F16C (the f16 <-> float conversions).
bool cpu_has_avx2_f16c();

}  // namespace draftfeed
