#include "draftfeed/common/finite.h"

#include <algorithm>
#include <cstring>

#include "draftfeed/common/cpu_features.h"

// DRAFTFEED_X86: as cpu_features.cc, whose cpu_has_avx2() chooses the kernel.
#if defined(DRAFTFEED_X86)
#include <immintrin.h>
#define DRAFTFEED_FINITE_X86 1
#endif

namespace draftfeed {

namespace {

// Exponent masks: an element is NaN or Inf exactly when all its exponent bits are set.
constexpr std::uint16_t kBF16Exponent = 0x7F80;
constexpr std::uint16_t kF16Exponent = 0x7C00;
constexpr std::uint32_t kF32Exponent = 0x7F800000u;
constexpr std::uint64_t kF64Exponent = 0x7FF0000000000000ull;

template <typename Word>
Word load(const std::uint8_t* p) {
  Word w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

// Scalar scan over `count` elements of `sizeof(Word)` bytes; used for tails and on other CPUs.
template <typename Word>
bool scalar_all_finite(const std::uint8_t* p, std::size_t count, Word mask) {
  Word hit = 0;
  for (std::size_t i = 0; i < count; ++i) {
    hit |= static_cast<Word>((load<Word>(p + i * sizeof(Word)) & mask) == mask);
  }
  return hit == 0;
}

#ifdef DRAFTFEED_FINITE_X86

// How many bytes the vector loops check between early-exit tests: small enough to stop soon after a
// bad block, large enough that the test costs nothing.
constexpr std::size_t kBlockBytes = 4096;

// Both kernels take the element width as a template argument (2 or 4 bytes) and the exponent
// mask, broadcast into every lane; a lane compares equal when its exponent bits are all set.
template <unsigned kWidth>
__m128i sse2_hits(__m128i v, __m128i m) {
  v = _mm_and_si128(v, m);
  return kWidth == 2 ? _mm_cmpeq_epi16(v, m) : _mm_cmpeq_epi32(v, m);
}

template <unsigned kWidth>
bool sse2_all_finite(const std::uint8_t* p, std::size_t bytes, std::uint32_t mask) {
  const __m128i m = kWidth == 2 ? _mm_set1_epi16(static_cast<short>(mask))
                                : _mm_set1_epi32(static_cast<int>(mask));
  std::size_t i = 0;
  while (i + 64 <= bytes) {
    __m128i acc = _mm_setzero_si128();
    const std::size_t block_end = bytes - i > kBlockBytes ? i + kBlockBytes : bytes;
    for (; i + 64 <= block_end; i += 64) {
      const auto* v = reinterpret_cast<const __m128i*>(p + i);
      const __m128i a = sse2_hits<kWidth>(_mm_loadu_si128(v), m);
      const __m128i b = sse2_hits<kWidth>(_mm_loadu_si128(v + 1), m);
      const __m128i c = sse2_hits<kWidth>(_mm_loadu_si128(v + 2), m);
      const __m128i d = sse2_hits<kWidth>(_mm_loadu_si128(v + 3), m);
      acc = _mm_or_si128(acc, _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)));
    }
    if (_mm_movemask_epi8(acc) != 0) return false;
  }
  const std::size_t rest = (bytes - i) / kWidth;
  if constexpr (kWidth == 2) {
    return scalar_all_finite<std::uint16_t>(p + i, rest, static_cast<std::uint16_t>(mask));
  } else {
    return scalar_all_finite<std::uint32_t>(p + i, rest, mask);
  }
}

template <unsigned kWidth>
__attribute__((target("avx2"))) __m256i avx2_hits(__m256i v, __m256i m) {
  v = _mm256_and_si256(v, m);
  return kWidth == 2 ? _mm256_cmpeq_epi16(v, m) : _mm256_cmpeq_epi32(v, m);
}

template <unsigned kWidth>
__attribute__((target("avx2"))) bool avx2_all_finite(const std::uint8_t* p, std::size_t bytes,
                                                     std::uint32_t mask) {
  const __m256i m = kWidth == 2 ? _mm256_set1_epi16(static_cast<short>(mask))
                                : _mm256_set1_epi32(static_cast<int>(mask));
  std::size_t i = 0;
  while (i + 128 <= bytes) {
    __m256i acc = _mm256_setzero_si256();
    const std::size_t block_end = bytes - i > kBlockBytes ? i + kBlockBytes : bytes;
    for (; i + 128 <= block_end; i += 128) {
      const auto* v = reinterpret_cast<const __m256i*>(p + i);
      const __m256i a = avx2_hits<kWidth>(_mm256_loadu_si256(v), m);
      const __m256i b = avx2_hits<kWidth>(_mm256_loadu_si256(v + 1), m);
      const __m256i c = avx2_hits<kWidth>(_mm256_loadu_si256(v + 2), m);
      const __m256i d = avx2_hits<kWidth>(_mm256_loadu_si256(v + 3), m);
      acc = _mm256_or_si256(acc, _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d)));
    }
    if (!_mm256_testz_si256(acc, acc)) {
      _mm256_zeroupper();  // before SSE code runs (batch/vector_store.h's vector_kernel_done says
                           // why)
      return false;
    }
  }
  _mm256_zeroupper();
  // Fewer than 128 bytes left: the SSE2 kernel finishes (it goes scalar below 64).
  return sse2_all_finite<kWidth>(p + i, bytes - i, mask);
}

#endif  // DRAFTFEED_FINITE_X86

bool vector_all_finite(const std::uint8_t* p, std::size_t count, unsigned width, std::uint32_t mask,
                       FiniteKernel kernel) {
#ifdef DRAFTFEED_FINITE_X86
  if (kernel == FiniteKernel::kAuto)
    kernel = cpu_has_avx2() ? FiniteKernel::kAvx2 : FiniteKernel::kSse2;
  if (kernel == FiniteKernel::kAvx2 && !cpu_has_avx2()) kernel = FiniteKernel::kSse2;
  if (kernel == FiniteKernel::kAvx2) {
    return width == 2 ? avx2_all_finite<2>(p, count * 2, mask)
                      : avx2_all_finite<4>(p, count * 4, mask);
  }
  if (kernel == FiniteKernel::kSse2) {
    return width == 2 ? sse2_all_finite<2>(p, count * 2, mask)
                      : sse2_all_finite<4>(p, count * 4, mask);
  }
#else
  (void)kernel;
#endif
  return width == 2 ? scalar_all_finite<std::uint16_t>(p, count, static_cast<std::uint16_t>(mask))
                    : scalar_all_finite<std::uint32_t>(p, count, mask);
}

// Adds one element's class to `counts`: exponent all ones and mantissa zero is Inf, else NaN.
template <typename Word>
void classify(Word bits, Word exponent_mask, NonFiniteCounts& counts) {
  if ((bits & exponent_mask) != exponent_mask) return;
  const Word sign_bit = static_cast<Word>(Word{1} << (sizeof(Word) * 8 - 1));
  const Word mantissa_mask = static_cast<Word>(~(exponent_mask | sign_bit));
  if ((bits & mantissa_mask) == 0) {
    ++counts.inf;
  } else {
    ++counts.nan;
  }
}

template <typename Word>
void count_per_slot(const std::uint8_t* p, std::int64_t rows, std::int64_t slots,
                    std::int64_t width, Word mask, std::span<NonFiniteCounts> counts) {
  std::size_t index = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t s = 0; s < slots; ++s) {
      NonFiniteCounts& slot = counts[static_cast<std::size_t>(s)];
      for (std::int64_t w = 0; w < width; ++w, ++index) {
        classify<Word>(load<Word>(p + index * sizeof(Word)), mask, slot);
      }
    }
  }
}

// F8 E4M3: the two NaN codes have every exponent and mantissa bit set (common/fp8.h).
bool fp8_all_finite(const std::uint8_t* p, std::size_t count) {
  std::uint8_t hit = 0;
  for (std::size_t i = 0; i < count; ++i) hit |= static_cast<std::uint8_t>((p[i] & 0x7F) == 0x7F);
  return hit == 0;
}

void fp8_count_per_slot(const std::uint8_t* p, std::int64_t rows, std::int64_t slots,
                        std::int64_t width, std::span<NonFiniteCounts> counts) {
  std::size_t index = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t s = 0; s < slots; ++s) {
      for (std::int64_t w = 0; w < width; ++w, ++index) {
        counts[static_cast<std::size_t>(s)].nan += (p[index] & 0x7F) == 0x7F;
      }
    }
  }
}

}  // namespace

bool finite_scan_supports(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32 ||
         dtype == DType::kF64 || dtype == DType::kF8E4M3;
}

bool all_finite(const void* data, std::size_t count, DType dtype, FiniteKernel kernel) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  switch (dtype) {
    case DType::kBF16:
      return vector_all_finite(p, count, 2, kBF16Exponent, kernel);
    case DType::kF16:
      return vector_all_finite(p, count, 2, kF16Exponent, kernel);
    case DType::kF32:
      return vector_all_finite(p, count, 4, kF32Exponent, kernel);
    case DType::kF64:
      return scalar_all_finite<std::uint64_t>(p, count, kF64Exponent);
    case DType::kF8E4M3:
      return fp8_all_finite(p, count);
    default:
      return true;
  }
}

void count_nonfinite_per_slot(const void* data, std::int64_t rows, std::int64_t slots,
                              std::int64_t width, DType dtype, std::span<NonFiniteCounts> out) {
  std::fill(out.begin(), out.end(), NonFiniteCounts{});
  if (slots <= 0 || out.size() < static_cast<std::size_t>(slots)) return;
  const auto* p = static_cast<const std::uint8_t*>(data);
  switch (dtype) {
    case DType::kBF16:
      return count_per_slot<std::uint16_t>(p, rows, slots, width, kBF16Exponent, out);
    case DType::kF16:
      return count_per_slot<std::uint16_t>(p, rows, slots, width, kF16Exponent, out);
    case DType::kF32:
      return count_per_slot<std::uint32_t>(p, rows, slots, width, kF32Exponent, out);
    case DType::kF64:
      return count_per_slot<std::uint64_t>(p, rows, slots, width, kF64Exponent, out);
    case DType::kF8E4M3:
      return fp8_count_per_slot(p, rows, slots, width, out);
    default:
      return;
  }
}

std::vector<NonFiniteCounts> count_nonfinite_per_slot(const void* data, std::int64_t rows,
                                                      std::int64_t slots, std::int64_t width,
                                                      DType dtype) {
  std::vector<NonFiniteCounts> counts(static_cast<std::size_t>(slots < 0 ? 0 : slots));
  count_nonfinite_per_slot(data, rows, slots, width, dtype, counts);
  return counts;
}

std::string_view finite_scan_kernel() {
#ifdef DRAFTFEED_FINITE_X86
  return cpu_has_avx2() ? "avx2" : "sse2";
#else
  return "scalar";
#endif
}

}  // namespace draftfeed
