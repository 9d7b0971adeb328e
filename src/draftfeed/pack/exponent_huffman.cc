#include "draftfeed/pack/exponent_huffman.h"

#include <algorithm>
#include <cstring>

#include "draftfeed/common/cpu_features.h"

namespace draftfeed {

namespace {

constexpr std::size_t kTableSize = std::size_t{1} << kHuffmanMaxBits;
constexpr int kPeekShift = 64 - kHuffmanMaxBits;
constexpr std::size_t kStreams = 4;
constexpr std::size_t kStreamSizeBytes = 4 * (kStreams - 1);
constexpr std::size_t kCacheLine = 64;
// Symbols one multi-symbol entry holds (a u32 of them, written whole).
constexpr unsigned kSymbolsPerEntry = 4;
// One refill of a stream's 64-bit window leaves at least 57 bits after the byte offset; five
// lookups of at most 11 bits each fit, so the fast loop refills once per five lookups.
constexpr unsigned kLookupsPerRefill = 5;
static_assert(kLookupsPerRefill * kHuffmanMaxBits <= 57);
constexpr std::size_t kFastOutBytes = std::size_t{kLookupsPerRefill} * kSymbolsPerEntry;
// The bytes a group of lookups moves the window by, at most (its bits after up to 7 of a byte).
constexpr std::size_t kGroupBytes = (7 + kLookupsPerRefill * kHuffmanMaxBits) / 8;

std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::size_t lengths_bytes(unsigned first, unsigned last) { return (last - first + 2) / 2; }

// A canonical code's codes (DEFLATE's rule: by length, then by symbol), most significant bit first.
std::array<std::uint16_t, 256> canonical_codes(const HuffmanLengths& lengths) {
  std::array<unsigned, kHuffmanMaxBits + 1> count{};
  for (const std::uint8_t l : lengths) {
    if (l != 0) ++count[l];
  }
  std::array<unsigned, kHuffmanMaxBits + 2> next{};
  for (int l = 2; l <= kHuffmanMaxBits; ++l) next[l] = (next[l - 1] + count[l - 1]) << 1;
  std::array<std::uint16_t, 256> codes{};
  for (std::size_t s = 0; s < 256; ++s) {
    if (lengths[s] != 0) codes[s] = static_cast<std::uint16_t>(next[lengths[s]]++);
  }
  return codes;
}

// Stream k's bytes of a plane of n: [k q, min(n, (k + 1) q)).
std::size_t stream_begin(std::size_t n, std::size_t k) {
  return std::min(n, (n + kStreams - 1) / kStreams * k);
}

class BitWriter {
 public:
  explicit BitWriter(std::vector<std::uint8_t>& out) : out_(out) {}
  void put(std::uint32_t code, unsigned bits) {
    acc_ = (acc_ << bits) | code;
    held_ += bits;
    if (held_ >= 32) {
      held_ -= 32;
      const auto word = static_cast<std::uint32_t>(acc_ >> held_);
      for (int shift = 24; shift >= 0; shift -= 8)
        out_.push_back(static_cast<std::uint8_t>(word >> shift));
      acc_ &= (std::uint64_t{1} << held_) - 1;
    }
  }
  void finish() {
    if (held_ % 8 != 0) {
      acc_ <<= 8 - held_ % 8;
      held_ += 8 - held_ % 8;
    }
    for (; held_ > 0; held_ -= 8) out_.push_back(static_cast<std::uint8_t>(acc_ >> (held_ - 8)));
  }

 private:
  std::vector<std::uint8_t>& out_;
  std::uint64_t acc_ = 0;
  unsigned held_ = 0;
};

// The next 64 bits of a stream from bit `pos`, its first 57 or more valid.
std::uint64_t peek(const std::uint8_t* base, std::uint64_t pos) {
  std::uint64_t w;
  std::memcpy(&w, base + (pos >> 3), sizeof w);
  return __builtin_bswap64(w) << (pos & 7);
}

// The same near a stream's end: the bytes past it read as zeros.
std::uint64_t peek_tail(const std::uint8_t* base, std::size_t bytes, std::uint64_t pos) {
  std::uint8_t window[8] = {};
  const std::uint64_t at = pos >> 3;
  if (at < bytes) std::memcpy(window, base + at, std::min<std::uint64_t>(8, bytes - at));
  std::uint64_t w;
  std::memcpy(&w, window, sizeof w);
  return __builtin_bswap64(w) << (pos & 7);
}

}  // namespace

void add_to_histogram(ByteHistogram& histogram, std::span<const std::uint8_t> bytes) {
  // Four tables: consecutive equal bytes (the common case) do not wait on one counter.
  std::array<std::array<std::uint32_t, 256>, 4> part{};
  std::size_t i = 0;
  const std::size_t n = bytes.size();
  while (i < n) {
    // Flushed before a u32 counter can overflow.
    const std::size_t stop = std::min(n, i + (std::size_t{1} << 30));
    for (; i + 4 <= stop; i += 4) {
      ++part[0][bytes[i]];
      ++part[1][bytes[i + 1]];
      ++part[2][bytes[i + 2]];
      ++part[3][bytes[i + 3]];
    }
    for (; i < stop; ++i) ++part[0][bytes[i]];
    for (std::size_t s = 0; s < 256; ++s) {
      histogram[s] += std::uint64_t{part[0][s]} + part[1][s] + part[2][s] + part[3][s];
      part[0][s] = part[1][s] = part[2][s] = part[3][s] = 0;
    }
  }
}

HuffmanLengths huffman_lengths(const ByteHistogram& histogram) {
  // Package-merge (Larmore and Hirschberg): the optimal code whose lengths are at most
  // kHuffmanMaxBits. Items of each level are leaves and packages (pairs of the level below's
  // items), sorted by weight; the first 2n - 2 items of the top level hold each symbol as many
  // times as its code has bits.
  struct Leaf {
    std::uint64_t weight;
    int symbol;
  };
  std::vector<Leaf> leaves;
  for (int s = 0; s < 256; ++s) {
    if (histogram[s] != 0) leaves.push_back({histogram[s], s});
  }
  // A complete code needs two symbols: a plane of one byte value gets its neighbour (which shares
  // its byte of the stored lengths), an empty one bytes 0 and 1.
  if (leaves.empty()) leaves.push_back({1, 0});
  if (leaves.size() == 1) leaves.push_back({1, leaves[0].symbol ^ 1});
  std::sort(leaves.begin(), leaves.end(), [](const Leaf& a, const Leaf& b) {
    return a.weight != b.weight ? a.weight < b.weight : a.symbol < b.symbol;
  });
  struct Item {
    std::uint64_t weight;
    int symbol;       // a leaf's symbol, or -1 for a package
    std::size_t low;  // a package's two items in the level below: low and low + 1
  };
  std::vector<std::vector<Item>> levels(kHuffmanMaxBits);
  for (const Leaf& leaf : leaves) levels[0].push_back({leaf.weight, leaf.symbol, 0});
  for (int level = 1; level < kHuffmanMaxBits; ++level) {
    const std::vector<Item>& below = levels[level - 1];
    std::vector<Item>& items = levels[level];
    std::size_t leaf = 0;
    std::size_t pair = 0;
    while (leaf < leaves.size() || pair + 1 < below.size()) {
      const bool take_leaf = pair + 1 >= below.size() ||
                             (leaf < leaves.size() &&
                              leaves[leaf].weight <= below[pair].weight + below[pair + 1].weight);
      if (take_leaf) {
        items.push_back({leaves[leaf].weight, leaves[leaf].symbol, 0});
        ++leaf;
      } else {
        items.push_back({below[pair].weight + below[pair + 1].weight, -1, pair});
        pair += 2;
      }
    }
  }
  HuffmanLengths lengths{};
  // Each chosen item's leaves, level by level down: a worklist instead of recursion.
  std::vector<std::pair<int, std::size_t>> work;
  const std::size_t chosen = 2 * leaves.size() - 2;
  for (std::size_t i = 0; i < chosen; ++i) work.emplace_back(kHuffmanMaxBits - 1, i);
  while (!work.empty()) {
    const auto [level, index] = work.back();
    work.pop_back();
    const Item& item = levels[level][index];
    if (item.symbol >= 0) {
      ++lengths[item.symbol];
    } else {
      work.emplace_back(level - 1, item.low);
      work.emplace_back(level - 1, item.low + 1);
    }
  }
  return lengths;
}

std::size_t huffman_stored_bytes(const HuffmanLengths& lengths, const ByteHistogram& histogram) {
  std::uint64_t bits = 0;
  unsigned first = 255;
  unsigned last = 0;
  for (unsigned s = 0; s < 256; ++s) {
    bits += histogram[s] * lengths[s];
    if (lengths[s] != 0) {
      first = std::min(first, s);
      last = std::max(last, s);
    }
  }
  if (first > last) first = last;
  // Each stream pads to a byte: at most 3 bytes more than the bits' own.
  return 2 + lengths_bytes(first, last) + kStreamSizeBytes + (bits + 7) / 8 + (kStreams - 1);
}

void huffman_encode(const HuffmanLengths& lengths, std::span<const std::uint8_t> plane,
                    std::vector<std::uint8_t>& out) {
  unsigned first = 255;
  unsigned last = 0;
  for (unsigned s = 0; s < 256; ++s) {
    if (lengths[s] != 0) {
      first = std::min(first, s);
      last = std::max(last, s);
    }
  }
  out.push_back(static_cast<std::uint8_t>(first));
  out.push_back(static_cast<std::uint8_t>(last));
  for (unsigned s = first; s <= last; s += 2) {
    const unsigned high = s + 1 <= last ? lengths[s + 1] : 0;
    out.push_back(static_cast<std::uint8_t>(lengths[s] | (high << 4)));
  }
  const std::size_t sizes_at = out.size();
  out.resize(out.size() + kStreamSizeBytes);
  const std::array<std::uint16_t, 256> codes = canonical_codes(lengths);
  const std::size_t n = plane.size();
  for (std::size_t k = 0; k < kStreams; ++k) {
    const std::size_t begin = out.size();
    BitWriter writer(out);
    for (std::size_t i = stream_begin(n, k); i < stream_begin(n, k + 1); ++i) {
      writer.put(codes[plane[i]], lengths[plane[i]]);
    }
    writer.finish();
    if (k + 1 < kStreams) {
      const auto bytes = static_cast<std::uint32_t>(out.size() - begin);
      std::memcpy(out.data() + sizes_at + 4 * k, &bytes, sizeof bytes);
    }
  }
}

const char* huffman_fault_text(HuffmanFault fault) {
  switch (fault) {
    case HuffmanFault::kNone:
      return "decodes";
    case HuffmanFault::kTruncated:
      return "is shorter than its header and stream sizes say";
    case HuffmanFault::kBadLengths:
      return "has code lengths that are not a complete code of at most 11 bits";
    case HuffmanFault::kBadStreams:
      return "has a stream that does not hold its bytes' codes exactly";
  }
  return "is not valid";
}

struct HuffmanDecoder::Tables {
  // For the next 11 bits: up to four symbols (first symbol lowest), and in `meta` the bits they
  // take (low byte) and their count (high byte). Two tables, so that a lookup's next window waits
  // on the small entry alone and shifts by it as it is (a shift uses the low 6 bits of its count).
  alignas(64) std::array<std::uint32_t, kTableSize> symbols{};
  alignas(64) std::array<std::uint16_t, kTableSize> meta{};
  // Entry for the next 11 bits: the first symbol (low byte) and its bits (high byte).
  alignas(64) std::array<std::uint16_t, kTableSize> single{};
  // The header the tables were built from; key_bytes 0 while none is.
  std::array<std::uint8_t, 2 + 128> key{};
  std::size_t key_bytes = 0;
};

HuffmanDecoder::HuffmanDecoder() : tables_(std::make_unique<Tables>()) {}
HuffmanDecoder::~HuffmanDecoder() = default;

bool HuffmanDecoder::load_code(const std::uint8_t* header, std::size_t header_bytes) {
  Tables& t = *tables_;
  if (t.key_bytes == header_bytes && std::memcmp(t.key.data(), header, header_bytes) == 0) {
    return true;
  }
  t.key_bytes = 0;
  std::array<std::uint8_t, 2 + 128> key{};
  std::memcpy(key.data(), header, header_bytes);  // read once: the header may be mapped
  const unsigned first = key[0];
  const unsigned last = key[1];
  HuffmanLengths lengths{};
  std::uint32_t kraft = 0;
  for (unsigned s = first; s <= last; ++s) {
    const unsigned nibble = key[2 + (s - first) / 2];
    const unsigned l = (s - first) % 2 == 0 ? nibble & 0x0FU : nibble >> 4;
    if (l > static_cast<unsigned>(kHuffmanMaxBits)) return false;
    lengths[s] = static_cast<std::uint8_t>(l);
    if (l != 0) kraft += 1U << (kHuffmanMaxBits - l);
  }
  // An incomplete code leaves table entries no symbol owns; an over-full one is no prefix code.
  if (kraft != kTableSize) return false;
  const std::array<std::uint16_t, 256> codes = canonical_codes(lengths);
  for (unsigned s = first; s <= last; ++s) {
    const unsigned l = lengths[s];
    if (l == 0) continue;
    const std::size_t from = std::size_t{codes[s]} << (kHuffmanMaxBits - l);
    const std::size_t to = std::size_t{codes[s] + 1U} << (kHuffmanMaxBits - l);
    for (std::size_t i = from; i < to; ++i) t.single[i] = static_cast<std::uint16_t>(s | (l << 8));
  }
  for (std::size_t i = 0; i < kTableSize; ++i) {
    std::uint64_t symbols = 0;
    unsigned count = 0;
    unsigned used = 0;
    while (count < kSymbolsPerEntry) {
      // The bits after `used`, zero-filled: a symbol whose code fits in what is left is decoded
      // right whatever the bits that follow.
      const std::uint16_t e = t.single[(i << used) & (kTableSize - 1)];
      const unsigned l = e >> 8;
      if (used + l > static_cast<unsigned>(kHuffmanMaxBits)) break;
      symbols |= std::uint64_t{static_cast<std::uint8_t>(e)} << (8 * count);
      ++count;
      used += l;
    }
    t.symbols[i] = static_cast<std::uint32_t>(symbols);
    t.meta[i] = static_cast<std::uint16_t>(used | (count << 8));
  }
  t.key = key;
  t.key_bytes = header_bytes;
  return true;
}

namespace {

struct MultiTable {
  const std::uint32_t* symbols;
  const std::uint16_t* meta;
};

// The fast loop's marker bit (group()): below the 57 bits a refill always holds.
constexpr unsigned kMarkerBit = 6;
constexpr std::uint64_t kMarker = std::uint64_t{1} << kMarkerBit;

// The four streams' state in the fast loop. Positions are bits from the first stream's first
// byte, so one base pointer serves all four (fewer registers: the loop keeps all of this in them).
struct Lanes {
  std::array<std::uint64_t, kStreams> pos;   // the next bit to read
  std::array<std::uint8_t*, kStreams> out;   // the next byte to write
  std::array<std::uint64_t, kStreams> stop;  // the byte after the stream's last
  std::array<std::uint8_t*, kStreams> end;   // the byte after the stream's output
  const std::uint8_t* warm;                  // the next line to fetch into the cache
  const std::uint8_t* warm_end;
};

// Groups of lookups stream k can run with no check: its 8-byte window stays inside its bytes (a
// group moves it by at most kGroupBytes) and its 4-byte stores inside its output (a group writes
// at most kFastOutBytes ahead).
std::size_t safe_groups(const Lanes& l, std::size_t k) {
  const std::uint64_t at = l.pos[k] >> 3;
  const auto room = static_cast<std::size_t>(l.end[k] - l.out[k]);
  if (at + 8 > l.stop[k] || room < kFastOutBytes) return 0;
  return std::min<std::size_t>((l.stop[k] - 8 - at) / kGroupBytes,
                               (room - kFastOutBytes) / kFastOutBytes) +
         1;
}

[[gnu::always_inline]] inline void group(const std::uint8_t* base, const MultiTable& multi,
                                         std::uint64_t& pos, std::uint8_t*& out) {
  // The window's 57 bits from `pos`, then a marker bit and zeros: the lookups shift it left by
  // the bits they take, so the marker's place says how many they took, with no count kept.
  std::uint64_t window = (peek(base, pos) & ~std::uint64_t{0x7F}) | kMarker;
  for (unsigned i = 0; i < kLookupsPerRefill; ++i) {
    const std::size_t at = window >> kPeekShift;
    const std::uint32_t symbols = multi.symbols[at];
    const unsigned meta = multi.meta[at];
    std::memcpy(out, &symbols, sizeof symbols);
    out += meta >> 8;
    window <<= meta & 63U;
  }
  pos += static_cast<unsigned>(__builtin_ctzll(window)) - kMarkerBit;
}

// `n` groups on each of the four streams, interleaved: their lookups are independent, so each
// one's table load waits while the others' go on.
[[gnu::always_inline]] inline void four_streams(const std::uint8_t* base, const MultiTable& multi,
                                                Lanes& l, std::size_t n) {
  std::uint64_t p0 = l.pos[0], p1 = l.pos[1], p2 = l.pos[2], p3 = l.pos[3];
  std::uint8_t *o0 = l.out[0], *o1 = l.out[1], *o2 = l.out[2], *o3 = l.out[3];
  const std::uint8_t* warm = l.warm;
  for (; n > 0; --n) {
    // One cache line of what the caller reads next per round (some 60 bytes decoded): fetched
    // while the core is busy with lookups, instead of waited for afterwards.
    if (warm < l.warm_end) {
      __builtin_prefetch(warm, 0, 3);
      warm += kCacheLine;
    }
    group(base, multi, p0, o0);
    group(base, multi, p1, o1);
    group(base, multi, p2, o2);
    group(base, multi, p3, o3);
  }
  l.pos = {p0, p1, p2, p3};
  l.out = {o0, o1, o2, o3};
  l.warm = warm;
}

// The fast loop: four streams while all have room, then each alone while it has.
[[gnu::always_inline]] inline void fast_loop(const std::uint8_t* base, const MultiTable& multi,
                                             Lanes& l) {
  for (;;) {
    const std::size_t n = std::min(std::min(safe_groups(l, 0), safe_groups(l, 1)),
                                   std::min(safe_groups(l, 2), safe_groups(l, 3)));
    if (n == 0) break;
    four_streams(base, multi, l, n);
  }
  for (std::size_t k = 0; k < kStreams; ++k) {
    for (std::size_t n = safe_groups(l, k); n > 0; n = safe_groups(l, k)) {
      for (; n > 0; --n) group(base, multi, l.pos[k], l.out[k]);
    }
  }
}

// The same loop built twice on x86 (DRAFTFEED_X86, as cpu_features.cc): with BMI2 (shifts by any
// register, no moves into CL), and without for a CPU that lacks it; chosen once.
void fast_loop_base(const std::uint8_t* base, const MultiTable& multi, Lanes& l) {
  fast_loop(base, multi, l);
}
using FastLoop = void (*)(const std::uint8_t*, const MultiTable&, Lanes&);
#if defined(DRAFTFEED_X86)
__attribute__((target("bmi2"))) void fast_loop_bmi2(const std::uint8_t* base,
                                                    const MultiTable& multi, Lanes& l) {
  fast_loop(base, multi, l);
}
const FastLoop kFastLoop = cpu_has_bmi2() ? fast_loop_bmi2 : fast_loop_base;
#else
const FastLoop kFastLoop = fast_loop_base;
#endif

}  // namespace

HuffmanFault HuffmanDecoder::decode(std::span<const std::uint8_t> stored,
                                    std::span<std::uint8_t> out,
                                    std::span<const std::uint8_t> read_next) {
  const std::size_t size = stored.size();
  if (size < 2) return HuffmanFault::kTruncated;
  const std::uint8_t* p = stored.data();
  if (p[1] < p[0]) return HuffmanFault::kBadLengths;
  const std::size_t header = 2 + lengths_bytes(p[0], p[1]);
  if (size < header + kStreamSizeBytes) return HuffmanFault::kTruncated;
  if (!load_code(p, header)) return HuffmanFault::kBadLengths;
  std::uint64_t sum = 0;
  Lanes l{};
  const std::size_t n = out.size();
  for (std::size_t k = 0; k < kStreams; ++k) {
    if (k + 1 < kStreams) {
      l.pos[k] = sum * 8;
      sum += get32(p + header + 4 * k);
      l.stop[k] = sum;
    }
    l.out[k] = out.data() + stream_begin(n, k);
    l.end[k] = out.data() + stream_begin(n, k + 1);
  }
  const std::size_t body = size - header - kStreamSizeBytes;
  if (sum > body) return HuffmanFault::kTruncated;
  l.pos[kStreams - 1] = sum * 8;
  l.stop[kStreams - 1] = body;
  l.warm = read_next.data();
  l.warm_end = read_next.data() + read_next.size();
  const std::uint8_t* base = p + header + kStreamSizeBytes;
  kFastLoop(base, MultiTable{tables_->symbols.data(), tables_->meta.data()}, l);
  const std::uint16_t* single = tables_->single.data();
  for (std::size_t k = 0; k < kStreams; ++k) {
    // The last bytes one symbol at a time, the window past the stream's end zero-filled (the
    // loop ends with the output); a stream whose bits do not end in its last byte is refused.
    const std::uint64_t first = k == 0 ? 0 : l.stop[k - 1];
    const std::uint8_t* stream = base + first;
    const std::size_t bytes = l.stop[k] - first;
    std::uint64_t pos = l.pos[k] - first * 8;
    for (std::uint8_t* o = l.out[k]; o < l.end[k]; ++o) {
      const std::uint16_t e = single[peek_tail(stream, bytes, pos) >> kPeekShift];
      *o = static_cast<std::uint8_t>(e);
      pos += e >> 8;
    }
    if ((pos + 7) / 8 != bytes) return HuffmanFault::kBadStreams;
  }
  return HuffmanFault::kNone;
}

}  // namespace draftfeed
