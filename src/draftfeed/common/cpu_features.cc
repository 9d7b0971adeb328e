#include "draftfeed/common/cpu_features.h"

#if defined(DRAFTFEED_X86)
#include <cpuid.h>
#endif

namespace draftfeed {

#if defined(DRAFTFEED_X86)

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") != 0;
  return has;
}

bool cpu_has_avx2_f16c() {
  // clang's __builtin_cpu_supports does not know "f16c": CPUID leaf 1 says (ECX bit 29); the
  // AVX2 check covers the OS saving the ymm registers, which F16C's VEX encoding needs too.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return cpu_has_avx2() && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

#else

bool cpu_has_avx2() { return false; }
bool cpu_has_avx2_f16c() { return false; }

#endif

}  // namespace draftfeed
