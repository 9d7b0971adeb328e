// The lossless codec of packed caches ("planes-zstd", docs/formats.md): a bf16 or FP8 tensor's
// bytes split into a plane of exponents, which compresses (hidden states cluster around a few
// magnitudes), and a plane of signs and mantissas, which does not (near-uniform bits); the
// exponent plane entropy-coded (our Huffman coder, pack/exponent_huffman.h, since version 2;
// libzstd in version 1, still read and still written on request), the other stored as it is.
// Decoding gives back the same bytes, bit for bit (NaN payloads, negative zeros and FP8's NaN codes
// included).
//
//   bf16  16 bits s|eeeeeeee|mmmmmmm -> exponent byte eeeeeeee, and byte s|mmmmmmm
//   FP8   E4M3 8 bits s|eeee|mmm     -> exponent nibble eeee, and nibble s|mmm; two values' nibbles
//                                       per byte (the first value in the low nibble)
//
// Values are coded in chunks of `chunk_values` (default 64 Ki), each chunk's exponent plane coded
// on its own (a Huffman plane or a zstd frame), or stored raw when coding would not make it
// smaller: a decoder can work chunk by chunk in a cache-sized buffer, and chunks decode
// independently. A Huffman blob's chunks share one code where the blob's own histogram serves
// them (the decoder then builds its table once per blob), a chunk's own where it saves more.
//
// Blob layout, little-endian, every field checked on decode (the blob is untrusted input):
//   "DFPZ"  u8 version (1 or 2)  u8 kind (1 bf16, 2 FP8)  u16 zero
//   u64 value count   u32 chunk_values   u32 chunk count   u64 XXH64 of the decoded bytes
//   chunk table: per chunk, u32 stored exponent bytes, u32 mode (0 raw, 1 zstd, 2 Huffman: version
//   2 only)
//   per chunk: its stored exponent plane, then its sign/mantissa plane (values bytes for bf16,
//   ceil(values / 2) for FP8)
// Thread safety: pure functions (each call uses its own contexts); a PlaneChunkDecoder is one
// thread's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/pack/exponent_huffman.h"

namespace draftfeed {

inline constexpr const char* kPlaneCodecName = "planes-zstd";
inline constexpr std::uint32_t kPlaneCodecDefaultChunk = 64 * 1024;

// The exponent planes' entropy coder. On bf16 planes our Huffman decoder is the faster, at a
// smaller size; on FP8's planes (two exponents a byte, about 5 bits of entropy a byte, two symbols
// a lookup at most) zstd's is, at the same size (docs/decisions.md, "The exponent planes' entropy
// stage", has the measurements): kAuto takes each where it is faster. zstd writes version 1 blobs,
// which readers from before version 2 read.
enum class PlaneEntropy : std::uint8_t { kAuto, kHuffman, kZstd };

// The coder kAuto means for `dtype`: Huffman for BF16, zstd for F8_E4M3.
PlaneEntropy plane_entropy_for(DType dtype, PlaneEntropy entropy);

struct PlaneCodecOptions {
  PlaneEntropy entropy = PlaneEntropy::kAuto;
  int zstd_level = 1;  // kZstd's; docs/decisions.md: higher levels gain < 1% on these planes
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

// A blob's header and chunk table, checked, and where each chunk's planes lie: what a reader needs
// to decode chunks one at a time, in any order, from any thread (the batch copy decodes the
// chunks of its rows only). Offsets are from the blob's first byte.
struct PlaneBlob {
  DType dtype = DType::kBF16;
  std::uint64_t values = 0;
  std::uint32_t chunk_values = 0;
  std::size_t blob_bytes = 0;
  enum class Mode : std::uint8_t { kRaw = 0, kZstd = 1, kHuffman = 2 };
  struct Chunk {
    std::uint64_t at = 0;      // the chunk's stored exponent plane
    std::uint32_t stored = 0;  // its bytes
    Mode mode = Mode::kRaw;    // how they are coded
  };
  std::vector<Chunk> chunks;

  std::size_t chunk_of(std::uint64_t value) const { return value / chunk_values; }
  std::uint64_t chunk_first(std::size_t c) const { return std::uint64_t{chunk_values} * c; }
  std::uint64_t chunk_count(std::size_t c) const;  // values in chunk c
};

// A blob left where it lies (a packed cache's shard mapping), parsed, for a reader that decodes the
// chunks it needs.
struct CompressedPlanes {
  const std::uint8_t* data = nullptr;  // the blob's first byte
  PlaneBlob planes;                    // its header and chunk table, checked
  std::string where;                   // the shard, the offset and the row, for messages
};

// Parses the header and chunk table at the start of a blob of `blob_bytes` bytes (`head` holds at
// least the header and the table, or the refusal says how many bytes it needs) holding `values`
// values of `dtype`. Checks every field and that the chunks' planes tile the blob exactly; the
// planes' bytes themselves are not read.
Result<PlaneBlob> plane_parse(DType dtype, std::span<const std::uint8_t> head,
                              std::size_t blob_bytes, std::uint64_t values);

// The header and table bytes plane_parse reads of a blob, from its first 32 bytes (its chunk
// count): 0 when those are not a header.
std::size_t plane_head_bytes(std::span<const std::uint8_t> first_32);

// Decodes single chunks of parsed blobs, with a zstd context, a Huffman decoder and an exponent
// buffer of its own, allocated by the constructor and reserve(): decode() allocates nothing, so
// it may run under a fault guard (common/fault_guard.h) reading a mapped blob.
class PlaneChunkDecoder {
 public:
  PlaneChunkDecoder();
  ~PlaneChunkDecoder();
  PlaneChunkDecoder(const PlaneChunkDecoder&) = delete;
  PlaneChunkDecoder& operator=(const PlaneChunkDecoder&) = delete;

  // Room for chunks of `chunk_values` values.
  void reserve(std::uint32_t chunk_values);

  // What one decode found: ok, or the zstd error code / the size it decoded to instead, or the
  // Huffman plane's fault.
  struct Status {
    bool ok = true;
    std::size_t zstd_code = 0;  // a zstd error code, or 0
    std::size_t got = 0;        // the bytes the frame decoded to, when not an error
    HuffmanFault huffman = HuffmanFault::kNone;
  };
  // Chunk `c` of `blob` (its bytes at `data`), decoded into `out` (chunk_count(c) values).
  // Needs reserve(blob.chunk_values) first.
  Status decode(const PlaneBlob& blob, const std::uint8_t* data, std::size_t c, std::uint8_t* out);

  // The refusal for a failed decode() of chunk `c`.
  static Error error(const PlaneBlob& blob, std::size_t c, const Status& status);

 private:
  struct Context;
  std::unique_ptr<Context> context_;
  std::vector<std::uint8_t> exponent_;
  HuffmanDecoder huffman_;
};

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
