#include "draftfeed/common/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(DRAFTFEED_X86)
#include <cpuid.h>
#endif

namespace draftfeed {

namespace {

std::atomic<bool> avx512_allowed{[] {
  const char* setting = std::getenv("DRAFTFEED_AVX512");
  return setting == nullptr || std::strcmp(setting, "0") != 0;
}()};

}  // namespace

#if defined(DRAFTFEED_X86)

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") != 0;
  return has;
}

bool cpu_has_bmi2() {
  static const bool has = __builtin_cpu_supports("bmi2") != 0;
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

bool cpu_has_avx512_kernels() {
  // From CPUID itself: neither GCC 12's nor clang 14's __builtin_cpu_supports knows every one of
  // these names.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_avx2_f16c() || __get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((ecx & bit_OSXSAVE) == 0) return false;
    // XCR0: the OS saves the ymm upper halves (bit 2), the mask registers (5) and the zmm
    // registers (6, 7), besides the SSE state (1).
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    if ((xcr0_low & 0xE6u) != 0xE6u) return false;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool f = (ebx & (1u << 16)) != 0, dq = (ebx & (1u << 17)) != 0;
    const bool bw = (ebx & (1u << 30)) != 0, vl = (ebx & (1u << 31)) != 0;
    const bool vbmi = (ecx & (1u << 1)) != 0;
    const unsigned max_subleaf = eax;
    if (!(f && dq && bw && vl && vbmi) || max_subleaf < 1) return false;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return (eax & (1u << 5)) != 0;  // AVX512_BF16
  }();
  return has;
}

#else

bool cpu_has_avx2() { return false; }
bool cpu_has_bmi2() { return false; }
bool cpu_has_avx2_f16c() { return false; }
bool cpu_has_avx512_kernels() { return false; }

#endif

bool avx512_kernels_enabled() {
  return avx512_allowed.load(std::memory_order_relaxed) && cpu_has_avx512_kernels();
}

bool set_avx512_kernels_allowed(bool allowed) {
  return avx512_allowed.exchange(allowed, std::memory_order_relaxed);
}

}  // namespace draftfeed
