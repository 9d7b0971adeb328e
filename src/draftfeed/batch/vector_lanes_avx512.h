// Lane helpers shared by the batch copy's AVX-512 kernels: the round of floats to bf16 by
// integer adds, and their stores.
#pragma once

#include <cstdint>

#include "draftfeed/common/cpu_features.h"

#if defined(DRAFTFEED_X86)
#include <immintrin.h>

namespace draftfeed {

// float_to_bf16 (dtype.h) by integer adds on 16 floats, without its NaN select (exact for every
// value but a NaN with low bits set), the bf16 in each 32-bit lane's low half.
__attribute__((target(DRAFTFEED_AVX512_TARGET))) inline __m512i round_to_bf16_low512(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd);
  return _mm512_srli_epi32(rounded, 16);
}

// Stores 64 bytes: with two 32-byte streaming stores when kStream (the row needs only 32-byte
// alignment, vector_store.h; a zmm store is two 256-bit ones on Zen 4 anyway), else unaligned.
template <bool kStream>
__attribute__((target(DRAFTFEED_AVX512_TARGET))) inline void store512(std::uint8_t* dst,
                                                                      __m512i value) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), _mm512_castsi512_si256(value));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), _mm512_extracti64x4_epi64(value, 1));
  } else {
    _mm512_storeu_si512(dst, value);
  }
}

}  // namespace draftfeed

#endif
