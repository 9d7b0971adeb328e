// The exponent planes' Huffman coder (pack/exponent_huffman.h): its lengths are a complete code
// of at most 11 bits, as short as an unlimited Huffman code's where that fits in 11 bits; the
// stored form is what the format says (read back here by a bit-at-a-time decoder written from the
// format's text alone); the table decoder gives back every plane byte for byte, across sizes
// around its stream and fast-loop boundaries and codes that change from plane to plane; a
// damaged plane is refused, never read past (the fuzz target pack_huffman_fuzz covers more).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <queue>
#include <random>
#include <vector>

#include "draftfeed/pack/exponent_huffman.h"

namespace draftfeed {
namespace {

ByteHistogram histogram_of(const std::vector<std::uint8_t>& plane) {
  ByteHistogram h{};
  add_to_histogram(h, plane);
  return h;
}

std::uint64_t kraft_sum(const HuffmanLengths& lengths) {
  std::uint64_t sum = 0;
  for (const std::uint8_t l : lengths) {
    if (l != 0) sum += std::uint64_t{1} << (kHuffmanMaxBits - l);
  }
  return sum;
}

std::uint64_t coded_bits(const HuffmanLengths& lengths, const ByteHistogram& h) {
  std::uint64_t bits = 0;
  for (std::size_t s = 0; s < 256; ++s) bits += h[s] * lengths[s];
  return bits;
}

// Huffman's own algorithm, no length limit: the bits of the optimal prefix code, and its
// longest code.
std::pair<std::uint64_t, unsigned> unlimited_huffman(const ByteHistogram& h) {
  using Node = std::pair<std::uint64_t, unsigned>;  // weight, height
  std::priority_queue<Node, std::vector<Node>, std::greater<>> heap;
  for (const std::uint64_t c : h) {
    if (c != 0) heap.push({c, 0});
  }
  std::uint64_t bits = 0;
  while (heap.size() > 1) {
    const Node a = heap.top();
    heap.pop();
    const Node b = heap.top();
    heap.pop();
    bits += a.first + b.first;  // every symbol below the new node gets one more bit
    heap.push({a.first + b.first, std::max(a.second, b.second) + 1});
  }
  return {bits, heap.empty() ? 0 : heap.top().second};
}
std::uint64_t unlimited_huffman_bits(const ByteHistogram& h) { return unlimited_huffman(h).first; }

// A plane of `n` bytes drawn from a two-sided geometric law around `center` (an exponent plane's
// shape: a few values common, a long tail).
std::vector<std::uint8_t> skewed_plane(std::size_t n, unsigned seed, double p = 0.45,
                                       int center = 120) {
  std::mt19937 gen(seed);
  std::geometric_distribution<int> tail(p);
  std::bernoulli_distribution side(0.5);
  std::vector<std::uint8_t> plane(n);
  for (auto& b : plane) {
    const int d = tail(gen);
    b = static_cast<std::uint8_t>(std::clamp(center + (side(gen) ? d : -d), 0, 255));
  }
  return plane;
}

std::vector<std::uint8_t> encoded(const std::vector<std::uint8_t>& plane) {
  std::vector<std::uint8_t> out;
  huffman_encode(huffman_lengths(histogram_of(plane)), plane, out);
  return out;
}

// The format's text, read bit by bit: the header's lengths, DEFLATE's canonical codes, four
// streams of quarters, most significant bit first. No tables, nothing shared with the decoder.
std::vector<std::uint8_t> reference_decode(const std::vector<std::uint8_t>& stored, std::size_t n) {
  const unsigned first = stored.at(0);
  const unsigned last = stored.at(1);
  std::vector<unsigned> lengths(256, 0);
  std::size_t at = 2;
  for (unsigned s = first; s <= last; ++s) {
    const unsigned byte = stored.at(at + (s - first) / 2);
    lengths[s] = (s - first) % 2 == 0 ? byte & 15 : byte >> 4;
  }
  at += (last - first + 2) / 2;
  std::vector<std::size_t> sizes(4);
  for (std::size_t k = 0; k < 3; ++k) {
    sizes[k] = stored.at(at) | stored.at(at + 1) << 8 | stored.at(at + 2) << 16 |
               std::size_t{stored.at(at + 3)} << 24;
    at += 4;
  }
  sizes[3] = stored.size() - at - sizes[0] - sizes[1] - sizes[2];
  // Canonical codes: by length, then by symbol, each the previous plus one, shifted left as the
  // length grows.
  std::vector<std::pair<unsigned, unsigned>> order;  // (length, symbol)
  for (unsigned s = 0; s < 256; ++s) {
    if (lengths[s] != 0) order.emplace_back(lengths[s], s);
  }
  std::sort(order.begin(), order.end());
  std::vector<std::pair<std::uint32_t, unsigned>> code_of(256, {0, 0});  // (code, length)
  std::uint32_t code = 0;
  unsigned length = order.empty() ? 0 : order[0].first;
  for (const auto& [l, s] : order) {
    code <<= (l - length);
    length = l;
    code_of[s] = {code, l};
    ++code;
  }
  std::vector<std::uint8_t> out;
  const std::size_t q = (n + 3) / 4;
  for (std::size_t k = 0; k < 4; ++k) {
    const std::size_t count = std::min(n, (k + 1) * q) - std::min(n, k * q);
    std::size_t bit = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::uint32_t value = 0;
      unsigned bits = 0;
      for (;;) {
        EXPECT_LT(bit / 8, sizes[k]) << "stream " << k << " runs out";
        if (bit / 8 >= sizes[k]) return out;
        value = value << 1 | ((stored[at + bit / 8] >> (7 - bit % 8)) & 1U);
        ++bit;
        ++bits;
        const auto match = std::find_if(order.begin(), order.end(), [&](const auto& entry) {
          return entry.first == bits && code_of[entry.second].first == value;
        });
        if (match != order.end()) {
          out.push_back(static_cast<std::uint8_t>(match->second));
          break;
        }
        EXPECT_LE(bits, 11U);
        if (bits > 11) return out;
      }
    }
    EXPECT_EQ((bit + 7) / 8, sizes[k]) << "stream " << k;
    at += sizes[k];
  }
  return out;
}

std::vector<std::uint8_t> table_decode(HuffmanDecoder& decoder,
                                       const std::vector<std::uint8_t>& stored, std::size_t n,
                                       HuffmanFault expected = HuffmanFault::kNone) {
  std::vector<std::uint8_t> out(n, 0xAA);
  EXPECT_EQ(decoder.decode(stored, out), expected);
  return out;
}

TEST(HuffmanLengths, AreACompleteCodeOfAtMostElevenBits) {
  std::vector<ByteHistogram> cases;
  ByteHistogram fibonacci{};  // the deepest unlimited Huffman tree: lengths up to 39
  std::uint64_t a = 1, b = 1;
  for (std::size_t s = 0; s < 40; ++s) {
    fibonacci[s] = a;
    const std::uint64_t next = a + b;
    a = b;
    b = next;
  }
  cases.push_back(fibonacci);
  ByteHistogram one{};  // a single byte value: a second code is added
  one[7] = 1000;
  cases.push_back(one);
  cases.push_back(ByteHistogram{});  // nothing at all
  ByteHistogram flat{};
  flat.fill(5);
  cases.push_back(flat);
  cases.push_back(histogram_of(skewed_plane(65536, 1)));
  cases.push_back(histogram_of(skewed_plane(65536, 2, 0.05)));
  for (const ByteHistogram& h : cases) {
    const HuffmanLengths lengths = huffman_lengths(h);
    EXPECT_EQ(kraft_sum(lengths), std::uint64_t{1} << kHuffmanMaxBits);
    for (std::size_t s = 0; s < 256; ++s) {
      EXPECT_LE(lengths[s], kHuffmanMaxBits);
      if (h[s] != 0) {
        EXPECT_GE(lengths[s], 1) << s;
      }
    }
  }
  // Where the optimal code fits in 11 bits, the limit costs nothing.
  int fitting = 0;
  for (unsigned seed = 1; seed < 12; ++seed) {
    const ByteHistogram h = histogram_of(skewed_plane(1000, seed, 0.5));
    const auto [bits, longest] = unlimited_huffman(h);
    if (longest > static_cast<unsigned>(kHuffmanMaxBits)) continue;
    ++fitting;
    EXPECT_EQ(coded_bits(huffman_lengths(h), h), bits) << seed;
  }
  EXPECT_GE(fitting, 5);
  // Where it does not, it costs little.
  const std::uint64_t limited = coded_bits(huffman_lengths(fibonacci), fibonacci);
  EXPECT_GE(limited, unlimited_huffman_bits(fibonacci));
  EXPECT_LT(static_cast<double>(limited),
            1.1 * static_cast<double>(unlimited_huffman_bits(fibonacci)));
}

TEST(HuffmanCoder, TheStoredFormIsTheFormatsAndDecodesBack) {
  HuffmanDecoder decoder;
  // Sizes around the four streams' split, the fast loop's 8-byte window and 16-byte output step.
  for (const std::size_t n : {1U, 2U, 3U, 4U, 5U, 7U, 8U, 15U, 16U, 17U, 63U, 64U, 65U, 100U, 255U,
                              1000U, 4097U, 65536U}) {
    for (const double p : {0.9, 0.45, 0.1}) {
      const auto plane = skewed_plane(n, static_cast<unsigned>(n), p);
      const auto stored = encoded(plane);
      EXPECT_EQ(reference_decode(stored, n), plane) << n << " " << p;
      EXPECT_EQ(table_decode(decoder, stored, n), plane) << n << " " << p;
      EXPECT_LE(stored.size(),
                huffman_stored_bytes(huffman_lengths(histogram_of(plane)), histogram_of(plane)));
    }
  }
  // Every byte value, each once: eight bits each.
  std::vector<std::uint8_t> all(256);
  for (std::size_t i = 0; i < 256; ++i) all[i] = static_cast<std::uint8_t>(255 - i);
  EXPECT_EQ(table_decode(decoder, encoded(all), 256), all);
  EXPECT_EQ(reference_decode(encoded(all), 256), all);
}

TEST(HuffmanCoder, AnEmptyPlaneAndAOneValuePlane) {
  HuffmanDecoder decoder;
  const std::vector<std::uint8_t> empty;
  EXPECT_EQ(table_decode(decoder, encoded(empty), 0), empty);
  const std::vector<std::uint8_t> same(70000, 0x7F);
  const auto stored = encoded(same);
  EXPECT_LT(stored.size(), 70000U / 8 + 64);  // one bit a byte
  EXPECT_EQ(table_decode(decoder, stored, same.size()), same);
}

TEST(HuffmanCoder, PlanesWithDifferentCodesDecodeOneAfterAnother) {
  // The decoder keeps the last code's tables: a plane of another code must not be read with them.
  HuffmanDecoder decoder;
  const auto a = skewed_plane(5000, 11, 0.45, 120);
  const auto b = skewed_plane(5000, 12, 0.2, 60);
  const auto stored_a = encoded(a);
  const auto stored_b = encoded(b);
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(table_decode(decoder, stored_a, a.size()), a);
    EXPECT_EQ(table_decode(decoder, stored_b, b.size()), b);
  }
  // A plane coded with a shared code that is not its own optimal one (the blob's code).
  ByteHistogram both = histogram_of(a);
  add_to_histogram(both, b);
  std::vector<std::uint8_t> shared;
  huffman_encode(huffman_lengths(both), a, shared);
  EXPECT_EQ(table_decode(decoder, shared, a.size()), a);
  EXPECT_EQ(reference_decode(shared, a.size()), a);
}

TEST(HuffmanCoder, DamagedPlanesAreRefusedNeverReadPast) {
  HuffmanDecoder decoder;
  const auto plane = skewed_plane(3000, 5);
  const auto stored = encoded(plane);
  // Cut short anywhere: refused (a copy of exactly the cut bytes, so ASan sees any read past).
  for (std::size_t cut = 0; cut < stored.size(); ++cut) {
    const std::vector<std::uint8_t> part(stored.begin(), stored.begin() + static_cast<long>(cut));
    std::vector<std::uint8_t> out(plane.size());
    EXPECT_NE(decoder.decode(part, out), HuffmanFault::kNone) << "cut at " << cut;
  }
  // Decoded to a size far from its own: its streams end in the wrong place. (A size one off may
  // end inside a stream's padding bits: the blob's hash of the decoded bytes is what catches it.)
  std::vector<std::uint8_t> shorter(plane.size() / 2);
  std::vector<std::uint8_t> longer(plane.size() * 2);
  EXPECT_EQ(decoder.decode(stored, shorter), HuffmanFault::kBadStreams);
  EXPECT_EQ(decoder.decode(stored, longer), HuffmanFault::kBadStreams);
  // Lengths that are no complete code, or past 11 bits.
  auto lengths = stored;
  lengths[2] = static_cast<std::uint8_t>((lengths[2] & 0xF0) | 0x0C);
  EXPECT_EQ(table_decode(decoder, lengths, plane.size(), HuffmanFault::kBadLengths).size(),
            plane.size());
  auto reversed = stored;
  std::swap(reversed[0], reversed[1]);
  table_decode(decoder, reversed, plane.size(), HuffmanFault::kBadLengths);
  // Stream sizes that claim more than there is.
  auto sizes = stored;
  const std::size_t sizes_at = 2 + (stored[1] - stored[0] + 2U) / 2;
  sizes[sizes_at + 3] = 0x40;
  table_decode(decoder, sizes, plane.size(), HuffmanFault::kTruncated);
  // Any byte changed: refused, or decoded to a plane of the right size (the planes' hash in the
  // blob catches the rest); the decoder still decodes the good plane afterwards.
  for (std::size_t at = 0; at < stored.size(); ++at) {
    auto changed = stored;
    changed[at] ^= 0x24;
    std::vector<std::uint8_t> out(plane.size());
    (void)decoder.decode(changed, out);
  }
  EXPECT_EQ(table_decode(decoder, stored, plane.size()), plane);
}

}  // namespace
}  // namespace draftfeed
