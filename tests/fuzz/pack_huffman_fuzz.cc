// libFuzzer target for the exponent planes' Huffman decoder (pack/exponent_huffman.h), three ways:
//   * the input as a stored plane, decoded to a size its first two bytes give: refused or
//     decoded, never read past (the plane is copied into a buffer of exactly its size, so ASan
//     sees a read one byte past);
//   * the input as a plane: encoded with its own code and decoded back, byte for byte, or abort;
//   * that encoded plane damaged where the input's first bytes say (a byte changed, the end cut):
//     refused or decoded, never read past.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "draftfeed/pack/exponent_huffman.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace draftfeed;
  if (size < 4) return 0;
  static HuffmanDecoder decoder;  // kept across inputs, as a copy thread's is across chunks
  const std::size_t n = data[0] | (std::size_t{data[1]} << 8);
  {
    const std::vector<std::uint8_t> stored(data + 2, data + size);
    std::vector<std::uint8_t> out(n);
    (void)decoder.decode(stored, out);
  }
  const std::span<const std::uint8_t> plane(data + 4, size - 4);
  ByteHistogram histogram{};
  add_to_histogram(histogram, plane);
  const HuffmanLengths lengths = huffman_lengths(histogram);
  std::vector<std::uint8_t> stored;
  huffman_encode(lengths, plane, stored);
  if (stored.size() > huffman_stored_bytes(lengths, histogram)) std::abort();
  std::vector<std::uint8_t> back(plane.size());
  if (decoder.decode(stored, back) != HuffmanFault::kNone) std::abort();
  if (!std::equal(back.begin(), back.end(), plane.begin())) std::abort();
  const std::size_t at = (data[0] | (std::size_t{data[1]} << 8)) % stored.size();
  stored[at] ^= data[2] == 0 ? 1 : data[2];
  const std::vector<std::uint8_t> damaged(
      stored.begin(),
      stored.end() - static_cast<long>(data[3] % 8 == 0 ? 0 : data[3] % stored.size()));
  (void)decoder.decode(damaged, back);
  return 0;
}
