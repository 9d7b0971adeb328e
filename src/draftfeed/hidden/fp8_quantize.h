// Writing hs-connectors' FP8 hidden-state files: what FP8HiddenStatesConnector writes for a
// sample, so that FP8Transfer (and draftfeed) read our files exactly as theirs.
//
// Quantization is hs-connectors' `quantize_tensor_to_fp8`, per token t, bit for bit:
//   amax[t]  = max |x| over the token's L x H values, in float32
//   scale[t] = max(amax[t] / 448, 1e-12)            (float32 division; 1e-12 rounded to float32)
//   code     = float_to_fp8_e4m3(x / scale[t])      (float32 division; common/fp8.h)
// and the file holds `hidden_states` F8_E4M3 [T, L, H], `hidden_states_scales` F32 [T, 1, 1] and
// the sample's `token_ids`, in the safetensors package's layout (safetensors_writer.h), as the
// connector's `save_file` lays them out: the same tensors give the same bytes.
// Thread safety: pure functions; files are written atomically (temporary + rename).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/hidden/hidden_state_sample.h"
#include "draftfeed/hidden/safetensors_writer.h"

namespace draftfeed {

// hs-connectors' lower bound on a scale (an all-zero token still gets a positive scale).
inline constexpr float kFp8MinScale = 1e-12f;

// Quantizes `tokens` rows of `per_token` values (bf16, f16 or f32 at `src`, any alignment) into
// `codes` (tokens x per_token bytes) and `scales` (tokens floats). Values must be finite (a NaN
// or Inf would make its token's scale NaN or Inf): callers validate first.
void quantize_fp8(const std::uint8_t* src, DType src_dtype, std::int64_t tokens,
                  std::int64_t per_token, std::uint8_t* codes, float* scales);

struct Fp8FileStats {
  std::uint64_t bytes = 0;  // size of the file written
};

// Writes the FP8 file of `sample` (validated: BF16, F16 or F32 hidden states [T, L, H], all
// finite) at `path`: its token_ids as they are, the quantized hidden states and their scales.
// Atomic by default (see SafetensorsWriteOptions). Throws Error: kInvalidArgument for a sample
// that is not bf16/f16/f32 [T, L, H], kIo naming the path when the OS refuses.
Fp8FileStats write_fp8_sample(const std::string& path, const HiddenStateSample& sample,
                              const SafetensorsWriteOptions& options = {});

}  // namespace draftfeed
