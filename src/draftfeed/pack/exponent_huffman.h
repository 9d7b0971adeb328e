// The entropy stage of packed caches' exponent planes (mode 2 of pack/plane_codec.h): a canonical
// Huffman code over bytes, its code lengths at most 11 bits, the plane cut in four streams that
// one decoder reads at once, and a decode table that gives up to four symbols per lookup.
//
// Why our own: a bf16 exponent plane carries about 3 bits per byte from a few dozen byte values
// and has no long repeats, so all of zstd's work on it is its Huffman literals stage, one symbol a
// lookup; zstd's Huffman entry points are not in Debian's libzstd, and no library Debian or PyPI
// ships decodes such planes as fast (docs/decisions.md, "The exponent planes' entropy stage", has
// the candidates side by side). With codes of at most 11 bits, one 2048-entry table (12 KiB, in
// L1) maps the next 11 bits of a stream to every whole symbol they hold, three or more for these
// planes; four independent streams keep the core busy while each waits on its own lookup.
//
// Stored form of one plane of n bytes, every field checked on decode (the bytes are untrusted):
//   u8 first, u8 last          the symbols with a code lie in [first, last]
//   ceil((last - first + 1) / 2) bytes of 4-bit code lengths, symbol first + 2i in the low nibble
//                              of byte i and first + 2i + 1 in its high nibble; 0: no code. The
//                              lengths must make a complete prefix code (Kraft sum exactly 1).
//   u32 x 3, little-endian     the bytes of streams 0, 1 and 2; stream 3 takes the rest
//   the four streams           stream k codes bytes [k q, min(n, (k + 1) q)), q = ceil(n / 4):
//                              canonical codes, most significant bit first, zero-padded to a byte;
//                              each stream's bits must end in its last byte
// Thread safety: the functions are pure; a HuffmanDecoder is one thread's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace draftfeed {

inline constexpr int kHuffmanMaxBits = 11;

// Counts of each byte value.
using ByteHistogram = std::array<std::uint64_t, 256>;
void add_to_histogram(ByteHistogram& histogram, std::span<const std::uint8_t> bytes);

// Code lengths (0: no code) of a length-limited Huffman code for `histogram`: every byte it counts
// gets a code of 1 to kHuffmanMaxBits bits, and the code is complete (a histogram of fewer than
// two byte values gets a second, unused code).
using HuffmanLengths = std::array<std::uint8_t, 256>;
HuffmanLengths huffman_lengths(const ByteHistogram& histogram);

// The bytes the stored form of a plane with `histogram` takes under `lengths` (which must give
// every counted byte a code).
std::size_t huffman_stored_bytes(const HuffmanLengths& lengths, const ByteHistogram& histogram);

// Appends the stored form of `plane` to `out`; `lengths` must give each of its bytes a code.
void huffman_encode(const HuffmanLengths& lengths, std::span<const std::uint8_t> plane,
                    std::vector<std::uint8_t>& out);

// Why a stored plane did not decode.
enum class HuffmanFault : std::uint8_t {
  kNone,
  kTruncated,   // shorter than its header and stream sizes say
  kBadLengths,  // code lengths out of range, or not a complete code
  kBadStreams,  // a stream ends before its bytes are decoded, or holds bytes after them
};
const char* huffman_fault_text(HuffmanFault fault);

// Decodes stored planes. The table of the last code it met is kept (a blob's chunks share one
// code), so a run of chunks with one code builds it once. decode() allocates nothing: it may run
// under a fault guard reading a mapped blob (a jump out of it leaves no table marked valid that
// is half built).
class HuffmanDecoder {
 public:
  HuffmanDecoder();
  ~HuffmanDecoder();
  HuffmanDecoder(const HuffmanDecoder&) = delete;
  HuffmanDecoder& operator=(const HuffmanDecoder&) = delete;

  // Decodes `stored` into `out`, which must be the plane's size exactly. `read_next`: bytes the
  // caller reads next (a chunk's other plane), fetched into the cache while the streams decode
  // (prefetches only: never read, so any range is safe).
  HuffmanFault decode(std::span<const std::uint8_t> stored, std::span<std::uint8_t> out,
                      std::span<const std::uint8_t> read_next = {});

 private:
  bool load_code(const std::uint8_t* header, std::size_t header_bytes);

  struct Tables;
  std::unique_ptr<Tables> tables_;
};

}  // namespace draftfeed
