// The lossless codec of packed caches ("planes-zstd", docs/formats.md): a bf16 or FP8 tensor's
// bytes split into a plane of exponents, which compresses (hidden states cluster around a few
// magnitudes), and a plane of signs and mantissas, which does not (near-uniform bits); the
// exponent plane entropy-coded with libzstd, the other stored as it is. Decoding gives back the
// same bytes, bit for bit (NaN payloads, negative zeros and FP8's NaN codes included).
//
//   bf16  16 bits s|eeeeeeee|mmmmmmm -> exponent byte eeeeeeee, and byte s|mmmmmmm
//   FP8   E4M3 8 bits s|eeee|mmm     -> exponent nibble eeee, and nibble s|mmm; two values' nibbles
//                                       per byte (the first value in the low nibble)
//
// Values are coded in chunks of `chunk_values` (default 64 Ki), each chunk's exponent plane a zstd
// frame of its own, or stored raw when zstd would not make it smaller: a decoder can work chunk by
// chunk in a cache-sized buffer, and chunks decode independently.
//
// Blob layout, little-endian, every field checked on decode (the blob is untrusted input):
//   "DFPZ"  u8 version (1)  u8 kind (1 bf16, 2 FP8)  u16 zero
//   u64 value count   u32 chunk_values   u32 chunk count   u64 XXH64 of the decoded bytes
//   chunk table: per chunk, u32 stored exponent bytes, u32 mode (0 raw, 1 zstd)
//   per chunk: its stored exponent plane, then its sign/mantissa plane (values bytes for bf16,
//   ceil(values / 2) for FP8)
// Thread safety: pure functions (each call uses its own zstd context).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

inline constexpr const char* kPlaneCodecName = "planes-zstd";
inline constexpr std::uint32_t kPlaneCodecDefaultChunk = 64 * 1024;

struct PlaneCodecOptions {
  int zstd_level = 1;  // docs/decisions.md: higher levels gain < 1% on these planes
  std::uint32_t chunk_values = kPlaneCodecDefaultChunk;
};

// Whether the codec takes tensors of this dtype (BF16, F8_E4M3).
bool plane_codec_supports(DType dtype);

// The blob for `bytes`, values of `dtype` (plane_codec_supports). Throws Error(kInvalidArgument)
// for another dtype or a byte count that is not whole values, Error(kIo) when zstd fails.
std::vector<std::uint8_t> plane_encode(DType dtype, std::span<const std::uint8_t> bytes,
                                       const PlaneCodecOptions& options = {});

// Decodes `blob` into `out`, which must be exactly the decoded size (value count x the dtype's
// size); the blob must say the same dtype and count. A refusal (kFormat) says what disagrees, at
// which byte of the blob; the decoded bytes are checked against the blob's XXH64 when
// `check_hash` (a reader that checked the blob's own checksum before may skip it).
std::optional<Error> plane_decode(DType dtype, std::span<const std::uint8_t> blob,
                                  std::span<std::uint8_t> out, bool check_hash = true);

// Byte counts of the two planes, for measurements: the stored exponent planes and the raw rest.
struct PlaneSizes {
  std::uint64_t exponent_raw = 0;
  std::uint64_t exponent_stored = 0;
  std::uint64_t rest = 0;
  std::uint64_t header = 0;
};
// The sizes `blob` (a valid one) is made of.
PlaneSizes plane_sizes(std::span<const std::uint8_t> blob);

}  // namespace draftfeed
