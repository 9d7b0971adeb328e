#include "draftfeed/batch/fp8_dequantize.h"

#include <cstring>

namespace draftfeed {

std::vector<std::uint8_t> dequantize_fp8_tensor(const std::uint8_t* codes,
                                                const std::uint8_t* scales, std::int64_t tokens,
                                                std::int64_t per_token, DType dequantize) {
  const std::size_t width = dequantize == DType::kF32 ? 4 : 2;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(tokens * per_token) * width);
  std::uint8_t* dst = out.data();
  for (std::int64_t t = 0; t < tokens; ++t) {
    float scale;
    std::memcpy(&scale, scales + t * 4, 4);
    for (std::int64_t i = 0; i < per_token; ++i, dst += width) {
      // The value is already rounded to D: storing it in D is exact.
      const float value = dequantize_fp8(codes[t * per_token + i], scale, dequantize);
      if (dequantize == DType::kF32) {
        std::memcpy(dst, &value, 4);
      } else {
        const std::uint16_t bits =
            dequantize == DType::kBF16 ? float_to_bf16(value) : float_to_f16(value);
        std::memcpy(dst, &bits, 2);
      }
    }
  }
  return out;
}

}  // namespace draftfeed
