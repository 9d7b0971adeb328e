#include "draftfeed/batch/hidden_copy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "draftfeed/batch/cast_row.h"
#include "draftfeed/batch/fp8_bf16_row.h"
#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/fp8_noise_row.h"
#include "draftfeed/batch/noise.h"
#include "draftfeed/batch/noise_bf16_row.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/common/hidden_value.h"

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

// Where a row's values come from: a file's bf16/f16/f32 elements as they are...
template <DType kSrc>
struct Elements {
  static constexpr DType kDType = kSrc;
  static constexpr bool kDequantized = false;
  const std::uint8_t* row;
  float value(std::int64_t i) const { return load_hidden_value<kSrc>(row, i); }
  // Checked on the file's bits (a value read is never more or less finite than its bits).
  bool nonfinite(std::int64_t i, float /*value*/) const {
    return hidden_value_nonfinite<kSrc>(row, i);
  }
};

// ...or FP8 codes with their token's scale, dequantized in kD as FP8Transfer does
// (fp8_dequantize.h). When kD rounds (bf16, f16), the token's 256 possible values are tabulated
// once from the scalar definition and each element is a lookup: the same bits in fewer
// instructions than converting and rounding every element (f16's conversions do not vectorise). For
// f32 one multiply per element is cheaper than a lookup. A value is non-finite after dequantizing:
// NaN codes, and overflow of kD. The commonest case, bf16 into a bf16 batch without noise, has its
// own AVX2 kernel (fp8_bf16_row.h) where the CPU has AVX2 and F16C; the table serves the others and
// that case elsewhere.
template <DType kD>
struct Fp8Elements {
  static constexpr DType kDType = DType::kF8E4M3;
  static constexpr bool kDequantized = true;
  static constexpr DType kDequantize = kD;
  static constexpr bool kTabulated = kD != DType::kF32;
  const std::uint8_t* row;
  float scale;  // the token's scale, rounded to kD
  float table[kTabulated ? 256 : 1];

  Fp8Elements(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t r) : row(codes) {
    float raw;
    std::memcpy(&raw, scales + r * 4, 4);
    scale = round_to_dtype<kD>(raw);
    if constexpr (kTabulated) {
      for (unsigned code = 0; code < 256; ++code) {
        table[code] = dequantize_fp8<kD>(static_cast<std::uint8_t>(code), scale);
      }
    }
  }
  float value(std::int64_t i) const {
    if constexpr (kTabulated) {
      return table[row[i]];
    } else {
      return dequantize_fp8<kD>(row[i], scale);
    }
  }
  bool nonfinite(std::int64_t /*i*/, float value) const {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    return (bits & 0x7F800000U) == 0x7F800000U;
  }
};

// A value already rounded to the batch dtype (FP8 dequantized in that dtype): stored without
// rounding again. Same bits as store_hidden_value<kDst>.
template <DType kDst>
inline void store_exact(std::uint8_t* base, std::int64_t i, float value) {
  if constexpr (kDst == DType::kF32) {
    std::memcpy(base + i * 4, &value, 4);
  } else {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const auto high = static_cast<std::uint16_t>(bits >> 16);
    std::memcpy(base + i * 2, &high, 2);
  }
}

template <class Source>
constexpr bool exact_in(DType dst) {
  if constexpr (Source::kDequantized) {
    return Source::kDequantize == dst;
  } else {
    return false;
  }
}

// One row with no noise. bf16 -> bf16 and f32 -> f32 are bit copies.
template <class Source, DType kDst>
inline std::int64_t row_plain(const Source& src, std::uint8_t* dst, std::int64_t n) {
  std::uint32_t bad = 0;
  if constexpr (Source::kDType == kDst) {
    std::memcpy(dst, src.row, static_cast<std::size_t>(n) * dtype_size(kDst));
    for (std::int64_t i = 0; i < n; ++i) bad += src.nonfinite(i, 0.0f);
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = src.value(i);
      bad += src.nonfinite(i, v);
      if constexpr (exact_in<Source>(kDst)) {
        store_exact<kDst>(dst, i, v);
      } else {
        store_hidden_value<kDst>(dst, i, v);
      }
    }
  }
  return bad;
}

template <class Source, DType kDst>
inline std::int64_t row_uniform(const Source& src, std::uint8_t* dst, std::int64_t n,
                                std::uint32_t key, float std_dev) {
  // One 32-bit draw serves an element pair: half the hashing. A row has far fewer than 2^32
  // elements. bf16 sources take an AVX2 kernel where the CPU has it (noise_bf16_row.h), with the
  // same bits: this loop stays the definition.
  std::uint32_t bad = 0;
  const std::int64_t pairs = n / 2;
  for (std::int64_t k = 0; k < pairs; ++k) {
    const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(k));
    const std::int64_t i = 2 * k;
    const float a = src.value(i);
    const float b = src.value(i + 1);
    bad += src.nonfinite(i, a) + src.nonfinite(i + 1, b);
    store_hidden_value<kDst>(dst, i, a + noise_signed_low(bits) * std_dev);
    store_hidden_value<kDst>(dst, i + 1, b + noise_signed_high(bits) * std_dev);
  }
  if (n % 2 != 0) {
    const std::uint32_t bits = noise_bits(key, static_cast<std::uint32_t>(pairs));
    const float a = src.value(n - 1);
    bad += src.nonfinite(n - 1, a);
    store_hidden_value<kDst>(dst, n - 1, a + noise_signed_low(bits) * std_dev);
  }
  return bad;
}

template <class Source, DType kDst>
inline std::int64_t row_gaussian(const Source& src, std::uint8_t* dst, std::int64_t n,
                                 std::uint32_t key, float std_dev) {
  std::int64_t bad = 0;
  constexpr float kTwoPi = 6.28318530717958647692f;
  for (std::int64_t i = 0; i < n; i += 2) {
    const float u1 = noise_uniform(key, static_cast<std::uint32_t>(i));
    const float u2 = noise_uniform(key, static_cast<std::uint32_t>(i + 1));
    const float radius = std::sqrt(-2.0f * std::log(1.0f - u1));
    const float a = src.value(i);
    bad += src.nonfinite(i, a);
    store_hidden_value<kDst>(dst, i, a + std_dev * radius * std::cos(kTwoPi * u2));
    if (i + 1 < n) {
      const float b = src.value(i + 1);
      bad += src.nonfinite(i + 1, b);
      store_hidden_value<kDst>(dst, i + 1, b + std_dev * radius * std::sin(kTwoPi * u2));
    }
  }
  return bad;
}

// Row r's source: its elements, with the token's scale for FP8.
template <class Source>
inline Source source_row(const RowCopy& job, const std::uint8_t* row, std::int64_t r) {
  if constexpr (Source::kDType == DType::kF8E4M3) {
    return Source(row, job.src_scales, r);
  } else {
    (void)job;
    (void)r;
    return Source{row};
  }
}

template <class Source, DType kDst>
DRAFTFEED_KERNEL std::int64_t copy_rows(const RowCopy& job) {
  const std::size_t src_stride =
      static_cast<std::size_t>(job.src_row_stride) * dtype_size(Source::kDType);
  const std::size_t dst_stride = static_cast<std::size_t>(job.dst_row_stride) * dtype_size(kDst);
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const Source src =
        source_row<Source>(job, job.src + static_cast<std::size_t>(r) * src_stride, r);
    std::uint8_t* dst = job.dst + static_cast<std::size_t>(r) * dst_stride;
    if (job.noise == NoiseKind::kNone) {
      bad += row_plain<Source, kDst>(src, dst, job.width);
      continue;
    }
    const auto token = static_cast<std::uint64_t>(job.first_token + r);
    const std::uint32_t key = noise_token_key(job.noise_sample_key, token);
    bad += job.noise == NoiseKind::kUniform
               ? row_uniform<Source, kDst>(src, dst, job.width, key, job.noise_std)
               : row_gaussian<Source, kDst>(src, dst, job.width, key, job.noise_std);
  }
  return bad;
}

template <class Source>
std::int64_t copy_from(const RowCopy& job) {
  return job.dst_dtype == DType::kF32 ? copy_rows<Source, DType::kF32>(job)
                                      : copy_rows<Source, DType::kBF16>(job);
}

// Whether a row loop asks for the start of the next row's source before copying a row.
enum class NextRow { kLeave, kPrefetch };

// Bytes at the start of a row that its kernel's own prefetch (prefetch_ahead in vector_lanes.h,
// which runs 512 bytes ahead) does not ask for.
inline constexpr std::size_t kRowStartBytes = 512;

// Runs `row(src, dst, r)` for each row of the job, summing what it returns: the row loop of the
// explicit kernels below (each does one row; the templates above inline theirs). kPrefetch: the
// compute-heavy kernels (uniform noise) first ask for the next row's first kRowStartBytes, which
// would otherwise be demand misses at the start of each row, since rows are strided (a token's
// layers not taken lie between them) and the hardware prefetcher starts over at each. The plain
// kernels keep more loads in flight themselves and gain nothing from it (docs/decisions.md).
template <NextRow kNext = NextRow::kLeave, class RowFn>
std::int64_t for_each_row(const RowCopy& job, RowFn row) {
  const std::size_t src_stride =
      static_cast<std::size_t>(job.src_row_stride) * dtype_size(job.src_dtype);
  const std::size_t dst_stride =
      static_cast<std::size_t>(job.dst_row_stride) * dtype_size(job.dst_dtype);
  const std::size_t start_bytes =
      std::min(kRowStartBytes, static_cast<std::size_t>(job.width) * dtype_size(job.src_dtype));
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const std::uint8_t* src = job.src + static_cast<std::size_t>(r) * src_stride;
    if (kNext == NextRow::kPrefetch && r + 1 < job.rows) {
      for (std::size_t b = 0; b < start_bytes; b += 64) __builtin_prefetch(src + src_stride + b);
    }
    bad += row(src, job.dst + static_cast<std::size_t>(r) * dst_stride, r);
  }
  return bad;
}

std::uint32_t row_noise_key(const RowCopy& job, std::int64_t r) {
  return noise_token_key(job.noise_sample_key, static_cast<std::uint64_t>(job.first_token + r));
}

float row_scale_bf16(const RowCopy& job, std::int64_t r) {
  float raw;
  std::memcpy(&raw, job.src_scales + r * 4, 4);
  return round_to_dtype<DType::kBF16>(raw);
}

// One bf16 row plus uniform noise into a bf16 (with AVX-512 where the CPU has it) or f32 row.
std::int64_t noise_bf16_row(const std::uint8_t* src, std::uint8_t* dst, std::int64_t n,
                            std::uint32_t key, float std_dev, bool f32, RowStores stores) {
  if (f32) return noise_bf16_f32_row_avx2(src, dst, n, key, std_dev, stores);
  return noise_bf16_row_avx512_available()
             ? noise_bf16_row_avx512(src, dst, n, key, std_dev, stores)
             : noise_bf16_row_avx2(src, dst, n, key, std_dev, stores);
}

// FP8 dequantized in bf16 into a bf16 batch without noise, where AVX2 is: each element computed
// directly, 16 at a time (fp8_bf16_row.h), 2.2x the table's lookups.
std::int64_t copy_fp8_bf16_avx2(const RowCopy& job) {
  return for_each_row(job, [&](const std::uint8_t* src, std::uint8_t* dst, std::int64_t r) {
    return fp8_bf16_row_avx2(src, row_scale_bf16(job, r), dst, job.width, job.stores);
  });
}

// FP8 dequantized in bf16 plus uniform noise into a bf16 or f32 batch, where AVX2 is: in one
// pass (fp8_noise_row.h; into bf16 with AVX-512 where the CPU has it) for a row that has no NaN
// code and a scale its tables apply to (nearly every row); otherwise the row is dequantized into a
// scratch row (as the file's bf16 would be: the same values, the same non-finite ones) that stays
// in cache, then noised from there. The scalar definition adds the noise to exactly those
// dequantized values, so the bits are row_uniform's either way.
std::int64_t copy_fp8_bf16_uniform_avx2(const RowCopy& job) {
  thread_local std::vector<std::uint8_t> scratch;
  const bool f32 = job.dst_dtype == DType::kF32;
  const bool avx512 = !f32 && fp8_noise_row_avx512_available();
  return for_each_row<NextRow::kPrefetch>(job, [&](const std::uint8_t* src, std::uint8_t* dst,
                                                   std::int64_t r) {
    const float scale = row_scale_bf16(job, r);
    const std::uint32_t key = row_noise_key(job, r);
    const bool done =
        avx512
            ? fp8_noise_row_avx512(src, scale, dst, job.width, key, job.noise_std, job.stores)
            : fp8_noise_row_avx2(src, scale, dst, job.width, key, job.noise_std, f32, job.stores);
    if (done) return std::int64_t{0};  // no NaN code, and every value finite
    scratch.resize(static_cast<std::size_t>(job.width) * 2);
    const std::int64_t bad =
        fp8_bf16_row_avx2(src, scale, scratch.data(), job.width, RowStores::kCached);
    noise_bf16_row(scratch.data(), dst, job.width, key, job.noise_std, f32, job.stores);
    return bad;
  });
}

// bf16 rows with uniform noise into a bf16 or f32 batch, where AVX2 is: 16 values at a time
// (noise_bf16_row.h), 32 into bf16 with AVX-512 where the CPU has it; the same bits as
// row_uniform.
std::int64_t copy_bf16_uniform_avx2(const RowCopy& job) {
  const bool f32 = job.dst_dtype == DType::kF32;
  return for_each_row<NextRow::kPrefetch>(
      job, [&](const std::uint8_t* src, std::uint8_t* dst, std::int64_t r) {
        return noise_bf16_row(src, dst, job.width, row_noise_key(job, r), job.noise_std, f32,
                              job.stores);
      });
}

// Rows without noise where AVX2 and F16C are: a bit copy with the count in the same pass, or a
// cast of f16/f32 to bf16 (cast_row.h). False where the job is none of those.
bool plain_avx2_applies(const RowCopy& job) {
  const bool float_source =
      job.src_dtype == DType::kBF16 || job.src_dtype == DType::kF16 || job.src_dtype == DType::kF32;
  if (job.noise != NoiseKind::kNone || !float_source || !cast_row_avx2_available()) return false;
  return job.src_dtype == job.dst_dtype || job.dst_dtype == DType::kBF16;
}

std::int64_t copy_plain_avx2(const RowCopy& job) {
  const bool same = job.src_dtype == job.dst_dtype;
  return for_each_row(job, [&](const std::uint8_t* src, std::uint8_t* dst, std::int64_t /*r*/) {
    return same ? copy_row_avx2(src, job.src_dtype, dst, job.width, job.stores)
                : cast_bf16_row_avx2(src, job.src_dtype, dst, job.width, job.stores);
  });
}

std::int64_t copy_from_fp8(const RowCopy& job) {
  switch (job.dequantize) {
    case DType::kBF16:
      if (fp8_bf16_row_avx2_available() && job.noise == NoiseKind::kNone &&
          job.dst_dtype == DType::kBF16) {
        return copy_fp8_bf16_avx2(job);
      }
      if (fp8_bf16_row_avx2_available() && noise_bf16_row_avx2_available() &&
          job.noise == NoiseKind::kUniform) {
        return copy_fp8_bf16_uniform_avx2(job);
      }
      return copy_from<Fp8Elements<DType::kBF16>>(job);
    case DType::kF16:
      return copy_from<Fp8Elements<DType::kF16>>(job);
    case DType::kF32:
      return copy_from<Fp8Elements<DType::kF32>>(job);
    default:
      break;
  }
  throw Error(ErrorKind::kInvalidArgument, "FP8 values dequantize into bf16, f16 or f32");
}

}  // namespace

std::int64_t copy_hidden_rows(const RowCopy& job) {
  if (plain_avx2_applies(job)) return copy_plain_avx2(job);
  switch (job.src_dtype) {
    case DType::kBF16:
      if (job.noise == NoiseKind::kUniform && noise_bf16_row_avx2_available()) {
        return copy_bf16_uniform_avx2(job);
      }
      return copy_from<Elements<DType::kBF16>>(job);
    case DType::kF16:
      return copy_from<Elements<DType::kF16>>(job);
    case DType::kF32:
      return copy_from<Elements<DType::kF32>>(job);
    case DType::kF8E4M3:
      return copy_from_fp8(job);
    default:
      break;
  }
  throw Error(ErrorKind::kUnsupported, "hidden states in a dtype the copy does not know (code " +
                                           std::to_string(static_cast<int>(job.src_dtype)) + ")");
}

}  // namespace draftfeed
