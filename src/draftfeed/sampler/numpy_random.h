// numpy's random permutation, reproduced bit for bit (docs/sampler.md).
//
// `numpy.random.default_rng(seed).permutation(n)` is: SeedSequence(seed) hashes the seed into four
// 64-bit words; PCG64 is seeded from them; `shuffle(arange(n))` then swaps from the last index down
// to 1 with `random_interval(i)` draws (masked rejection on buffered 32-bit outputs). The planner's
// epoch order must equal the reference's, so every step here follows numpy's published algorithm
// (numpy/random/bit_generator.pyx, pcg64.h, distributions.c), tested against numpy itself.
// Thread safety: the functions are pure; a Pcg64 object is not shared between threads.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace draftfeed {

// A 128-bit unsigned integer (GCC and Clang); `__extension__` keeps -Wpedantic quiet about it.
__extension__ typedef unsigned __int128 Uint128;

// A non-negative integer seed of any size, as numpy splits it: 32-bit words, least significant
// first (zero is one zero word).
std::vector<std::uint32_t> seed_words(Uint128 seed);

// `numpy.random.SeedSequence(entropy).generate_state(4, numpy.uint64)` for a seed given as words
// (as `seed_words` makes them; no spawn key).
std::array<std::uint64_t, 4> seed_sequence_state(std::span<const std::uint32_t> entropy_words);

// numpy's PCG64 bit generator (128-bit LCG, XSL-RR output) with its 32-bit draw buffer.
class Pcg64 {
 public:
  // Seeded as numpy's PCG64(SeedSequence) does: state words 0,1 are the initial state (high word
  // first), words 2,3 the stream selector.
  explicit Pcg64(const std::array<std::uint64_t, 4>& seed_state);

  std::uint64_t next64() {
    state_ = state_ * kMultiplier + increment_;
    const auto high = static_cast<std::uint64_t>(state_ >> 64);
    const auto low = static_cast<std::uint64_t>(state_);
    const unsigned rotation = static_cast<unsigned>(high >> 58);
    const std::uint64_t mixed = high ^ low;
    return (mixed >> rotation) | (mixed << ((64U - rotation) & 63U));
  }

  // One 64-bit output serves two calls: its low half now, its high half next time.
  std::uint32_t next32() {
    if (has_buffered_) {
      has_buffered_ = false;
      return buffered_;
    }
    const std::uint64_t next = next64();
    has_buffered_ = true;
    buffered_ = static_cast<std::uint32_t>(next >> 32);
    return static_cast<std::uint32_t>(next);
  }

  // numpy's `random_interval(max)`: uniform in [0, max] by masked rejection; 32-bit draws while max
  // fits in 32 bits, 64-bit draws beyond.
  std::uint64_t interval(std::uint64_t max) {
    if (max == 0) return 0;
    std::uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    std::uint64_t value = 0;
    if (max <= 0xFFFFFFFFULL) {
      while ((value = (next32() & mask)) > max) {
      }
    } else {
      while ((value = (next64() & mask)) > max) {
      }
    }
    return value;
  }

 private:
  static constexpr Uint128 kMultiplier =
      (static_cast<Uint128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;

  Uint128 state_ = 0;
  Uint128 increment_ = 0;
  bool has_buffered_ = false;
  std::uint32_t buffered_ = 0;
};

// `Generator.shuffle` of a 1-d array: for i from size-1 down to 1, swap items i and interval(i).
void numpy_shuffle(Pcg64& rng, std::span<std::int64_t> items);

// `numpy.random.default_rng(seed).permutation(n)`. Throws Error(kInvalidArgument) for n < 0.
std::vector<std::int64_t> numpy_permutation(std::span<const std::uint32_t> seed_words,
                                            std::int64_t n);
std::vector<std::int64_t> numpy_permutation(std::uint64_t seed, std::int64_t n);

// `numpy.random.default_rng(seed).permutation(items)`: a shuffled copy of the given array.
std::vector<std::int64_t> numpy_permutation_of(std::span<const std::uint32_t> seed_words,
                                               std::span<const std::int64_t> items);

}  // namespace draftfeed
