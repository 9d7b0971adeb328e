// Allows or forbids the batch copy's AVX-512 kernels for a scope (cpu_features.h), so a test runs
// the copy both ways; what was allowed before comes back however the scope ends.
#pragma once

#include "draftfeed/common/cpu_features.h"

namespace draftfeed {

class Avx512Allowed {
 public:
  explicit Avx512Allowed(bool allowed) : previous_(set_avx512_kernels_allowed(allowed)) {}
  ~Avx512Allowed() { set_avx512_kernels_allowed(previous_); }
  Avx512Allowed(const Avx512Allowed&) = delete;
  Avx512Allowed& operator=(const Avx512Allowed&) = delete;

 private:
  bool previous_;
};

}  // namespace draftfeed
