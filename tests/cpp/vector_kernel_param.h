// For tests run once per instruction set of a batch-copy kernel (AVX2, AVX-512): the parameter,
// its name in the test's name, and the skip where this CPU cannot run the kernel.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace draftfeed {

enum class VectorIsa { kAvx2, kAvx512 };

inline std::string vector_isa_name(const testing::TestParamInfo<VectorIsa>& info) {
  return info.param == VectorIsa::kAvx2 ? "avx2" : "avx512";
}

class VectorKernelTest : public testing::TestWithParam<VectorIsa> {
 protected:
  // Call from SetUp: skips the test (its body does not run) where its kernel cannot run here.
  void skip_unless_available(bool avx2_available, bool avx512_available) {
    if (GetParam() == VectorIsa::kAvx2 && !avx2_available) {
      GTEST_SKIP() << "no AVX2 (and F16C) on this CPU";
    }
    if (GetParam() == VectorIsa::kAvx512 && !avx512_available) {
      GTEST_SKIP() << "no AVX-512 (F, BW, DQ, VL, VBMI, BF16) on this CPU, or DRAFTFEED_AVX512=0";
    }
  }

  // The batch dtypes the kernel writes, as "is it f32": the AVX-512 kernels write only bf16.
  std::vector<bool> f32_cases() const {
    return GetParam() == VectorIsa::kAvx2 ? std::vector<bool>{false, true}
                                          : std::vector<bool>{false};
  }
};

}  // namespace draftfeed
