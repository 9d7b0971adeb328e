#include "draftfeed/hidden/fp8_quantize.h"

#include <cmath>
#include <cstring>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/fp8.h"
#include "draftfeed/common/hidden_value.h"

namespace draftfeed {

namespace {

template <DType kSrc>
void quantize_rows(const std::uint8_t* src, std::int64_t tokens, std::int64_t per_token,
                   std::uint8_t* codes, float* scales) {
  const std::size_t row_bytes = static_cast<std::size_t>(per_token) * dtype_size(kSrc);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::uint8_t* row = src + static_cast<std::size_t>(t) * row_bytes;
    float amax = 0.0f;
    for (std::int64_t i = 0; i < per_token; ++i)
      amax = std::fmax(amax, std::fabs(load_hidden_value<kSrc>(row, i)));
    // clamp(min=1e-12) as torch does it: the larger of the two (a NaN amax is excluded by the
    // caller's validation).
    const float quotient = amax / kFp8E4M3Max;
    const float scale = quotient < kFp8MinScale ? kFp8MinScale : quotient;
    scales[t] = scale;
    std::uint8_t* out = codes + static_cast<std::size_t>(t * per_token);
    for (std::int64_t i = 0; i < per_token; ++i)
      out[i] = float_to_fp8_e4m3(load_hidden_value<kSrc>(row, i) / scale);
  }
}

DType hidden_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return DType::kBF16;
    case DType::kF16:
      return DType::kF16;
    case DType::kF32:
      return DType::kF32;
    default:
      break;
  }
  throw Error(ErrorKind::kInvalidArgument,
              "FP8 quantization reads BF16, F16 or F32 hidden states, not " +
                  std::string(dtype_name(dtype)));
}

}  // namespace

void quantize_fp8(const std::uint8_t* src, DType src_dtype, std::int64_t tokens,
                  std::int64_t per_token, std::uint8_t* codes, float* scales) {
  switch (src_dtype) {
    case DType::kBF16:
      return quantize_rows<DType::kBF16>(src, tokens, per_token, codes, scales);
    case DType::kF16:
      return quantize_rows<DType::kF16>(src, tokens, per_token, codes, scales);
    case DType::kF32:
      return quantize_rows<DType::kF32>(src, tokens, per_token, codes, scales);
    default:
      break;
  }
  throw Error(ErrorKind::kInvalidArgument, "FP8 quantization reads bf16, f16 or f32 values");
}

Fp8FileStats write_fp8_sample(const std::string& path, const HiddenStateSample& sample,
                              const SafetensorsWriteOptions& options) {
  const TensorView& states = sample.hidden_states;
  require(states.shape.size() == 3, ErrorKind::kInvalidArgument,
          sample.path() + ": hidden_states has shape " + shape_to_string(states.shape) +
              ", expected [tokens, layers, hidden]");
  const DType src_dtype = hidden_dtype_of(states.dtype);
  const std::int64_t tokens = states.shape[0];
  const std::int64_t per_token = states.shape[1] * states.shape[2];
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(tokens * per_token));
  std::vector<float> scales(static_cast<std::size_t>(tokens));
  // The values lie in the source file's mapping, which another process may shrink meanwhile.
  if (!guard_mapped_reads([&] {
        quantize_fp8(states.data, src_dtype, tokens, per_token, codes.data(), scales.data());
      })) {
    throw Error(ErrorKind::kIo, sample.path() +
                                    ": the file shrank while its hidden states were read "
                                    "(truncated by another process: SIGBUS on the mapping)");
  }

  const TensorView& ids = sample.token_ids;
  const std::vector<TensorToWrite> tensors = {
      {kTokenIdsKey, ids.dtype, ids.shape, ids.bytes()},
      {kHiddenStatesKey, DType::kF8E4M3, states.shape, codes},
      {kHiddenStatesScalesKey,
       DType::kF32,
       {tokens, 1, 1},
       {reinterpret_cast<const std::uint8_t*>(scales.data()), scales.size() * sizeof(float)}},
  };
  write_safetensors(path, tensors, nullptr, options);
  Fp8FileStats stats;
  stats.bytes = 8 + safetensors_header(tensors, nullptr).size();
  for (const auto& tensor : tensors) stats.bytes += tensor.bytes.size();
  return stats;
}

}  // namespace draftfeed
