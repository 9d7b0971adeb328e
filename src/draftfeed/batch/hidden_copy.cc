#include "draftfeed/batch/hidden_copy.h"

#include <cmath>
#include <cstring>
#include <string>

#include "draftfeed/batch/noise.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"

// Kernels are compiled twice, for AVX2 and for the baseline, and chosen at load time (GCC ifunc),
// so one binary runs everywhere and uses wide vectors where it can. Sanitizer builds keep one
// version, and so does clang (the fuzzers' compiler), which cannot clone function templates.
#if defined(DRAFTFEED_X86) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define DRAFTFEED_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define DRAFTFEED_KERNEL
#endif

namespace draftfeed {

namespace {

template <HiddenDType kSrc>
inline float load(const std::uint8_t* base, std::int64_t i) {
  if constexpr (kSrc == HiddenDType::kF32) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  } else {
    std::uint16_t v;
    std::memcpy(&v, base + i * 2, 2);
    if constexpr (kSrc == HiddenDType::kBF16) {
      return bf16_to_float(v);
    } else {
      return f16_to_float(v);
    }
  }
}

template <HiddenDType kSrc>
inline bool is_nonfinite(const std::uint8_t* base, std::int64_t i) {
  if constexpr (kSrc == HiddenDType::kF32) {
    std::uint32_t v;
    std::memcpy(&v, base + i * 4, 4);
    return (v & 0x7F800000U) == 0x7F800000U;
  } else {
    std::uint16_t v;
    std::memcpy(&v, base + i * 2, 2);
    const std::uint16_t mask = kSrc == HiddenDType::kBF16 ? 0x7F80 : 0x7C00;
    return (v & mask) == mask;
  }
}

template <HiddenDType kDst>
inline void store(std::uint8_t* base, std::int64_t i, float value) {
  if constexpr (kDst == HiddenDType::kF32) {
    std::memcpy(base + i * 4, &value, 4);
  } else {
    const std::uint16_t v = float_to_bf16(value);
    std::memcpy(base + i * 2, &v, 2);
  }
}

// One row with no noise. bf16 -> bf16 and f32 -> f32 are bit copies.
template <HiddenDType kSrc, HiddenDType kDst>
inline std::int64_t row_plain(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n) {
  std::int64_t bad = 0;
  if constexpr (kSrc == kDst) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * hidden_dtype_size(kSrc));
    for (std::int64_t i = 0; i < n; ++i) bad += is_nonfinite<kSrc>(src, i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      bad += is_nonfinite<kSrc>(src, i);
      store<kDst>(dst, i, load<kSrc>(src, i));
    }
  }
  return bad;
}

template <HiddenDType kSrc, HiddenDType kDst>
inline std::int64_t row_uniform(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                std::uint32_t key, float std_dev) {
  // One 32-bit draw serves an element pair: half the hashing. A row has far fewer than 2^32
  // elements.
  std::uint32_t bad = 0;
  const std::int64_t pairs = n / 2;
  for (std::int64_t k = 0; k < pairs; ++k) {
    const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(k));
    const std::int64_t i = 2 * k;
    bad += is_nonfinite<kSrc>(src, i) + is_nonfinite<kSrc>(src, i + 1);
    store<kDst>(dst, i, load<kSrc>(src, i) + noise_signed_low(bits) * std_dev);
    store<kDst>(dst, i + 1, load<kSrc>(src, i + 1) + noise_signed_high(bits) * std_dev);
  }
  if (n % 2 != 0) {
    const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(pairs));
    bad += is_nonfinite<kSrc>(src, n - 1);
    store<kDst>(dst, n - 1, load<kSrc>(src, n - 1) + noise_signed_low(bits) * std_dev);
  }
  return bad;
}

template <HiddenDType kSrc, HiddenDType kDst>
inline std::int64_t row_gaussian(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                                 std::uint32_t key, float std_dev) {
  std::int64_t bad = 0;
  constexpr float kTwoPi = 6.28318530717958647692f;
  for (std::int64_t i = 0; i < n; i += 2) {
    const float u1 = noise_uniform(key, static_cast<std::uint32_t>(i));
    const float u2 = noise_uniform(key, static_cast<std::uint32_t>(i + 1));
    const float radius = std::sqrt(-2.0f * std::log(1.0f - u1));
    bad += is_nonfinite<kSrc>(src, i);
    store<kDst>(dst, i, load<kSrc>(src, i) + std_dev * radius * std::cos(kTwoPi * u2));
    if (i + 1 < n) {
      bad += is_nonfinite<kSrc>(src, i + 1);
      store<kDst>(dst, i + 1, load<kSrc>(src, i + 1) + std_dev * radius * std::sin(kTwoPi * u2));
    }
  }
  return bad;
}

template <HiddenDType kSrc, HiddenDType kDst>
DRAFTFEED_KERNEL std::int64_t copy_rows(const RowCopy& job) {
  const std::size_t src_stride =
      static_cast<std::size_t>(job.src_row_stride) * hidden_dtype_size(kSrc);
  const std::size_t dst_stride =
      static_cast<std::size_t>(job.dst_row_stride) * hidden_dtype_size(kDst);
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const std::uint8_t* src = job.src + static_cast<std::size_t>(r) * src_stride;
    std::uint8_t* dst = job.dst + static_cast<std::size_t>(r) * dst_stride;
    if (job.noise == NoiseKind::kNone) {
      bad += row_plain<kSrc, kDst>(src, dst, job.width);
      continue;
    }
    const auto token = static_cast<std::uint64_t>(job.first_token + r);
    const std::uint32_t key = noise_token_key(job.noise_sample_key, token);
    bad += job.noise == NoiseKind::kUniform
               ? row_uniform<kSrc, kDst>(src, dst, job.width, key, job.noise_std)
               : row_gaussian<kSrc, kDst>(src, dst, job.width, key, job.noise_std);
  }
  return bad;
}

template <HiddenDType kSrc>
std::int64_t copy_from(const RowCopy& job) {
  return job.dst_dtype == HiddenDType::kF32 ? copy_rows<kSrc, HiddenDType::kF32>(job)
                                            : copy_rows<kSrc, HiddenDType::kBF16>(job);
}

}  // namespace

std::int64_t copy_hidden_rows(const RowCopy& job) {
  switch (job.src_dtype) {
    case HiddenDType::kBF16:
      return copy_from<HiddenDType::kBF16>(job);
    case HiddenDType::kF16:
      return copy_from<HiddenDType::kF16>(job);
    case HiddenDType::kF32:
      return copy_from<HiddenDType::kF32>(job);
  }
  throw Error(ErrorKind::kUnsupported, "hidden states in a dtype the copy does not know (code " +
                                           std::to_string(static_cast<int>(job.src_dtype)) + ")");
}

}  // namespace draftfeed
