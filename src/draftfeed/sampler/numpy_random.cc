#include "draftfeed/sampler/numpy_random.h"

#include <numeric>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

// SeedSequence's hashing constants (numpy/random/bit_generator.pyx); all arithmetic is mod 2^32.
constexpr std::uint32_t kInitA = 0x43b0d7e5U;
constexpr std::uint32_t kMultA = 0x931e8875U;
constexpr std::uint32_t kInitB = 0x8b51f9ddU;
constexpr std::uint32_t kMultB = 0x58f38dedU;
constexpr std::uint32_t kMixMultL = 0xca01f9ddU;
constexpr std::uint32_t kMixMultR = 0x4973f715U;
constexpr unsigned kXShift = 16;  // half the bits of a 32-bit word
constexpr std::size_t kPoolSize = 4;

// Hashes one word; `hash_const` advances on every call, so call order matters.
std::uint32_t hashmix(std::uint32_t value, std::uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

std::uint32_t mix(std::uint32_t x, std::uint32_t y) {
  std::uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

}  // namespace

std::vector<std::uint32_t> seed_words(Uint128 seed) {
  std::vector<std::uint32_t> words;
  if (seed == 0) words.push_back(0);
  while (seed != 0) {
    words.push_back(static_cast<std::uint32_t>(seed));
    seed >>= 32;
  }
  return words;
}

std::array<std::uint64_t, 4> seed_sequence_state(std::span<const std::uint32_t> entropy_words) {
  // Mix the entropy into a pool of four words (SeedSequence.mix_entropy).
  std::array<std::uint32_t, kPoolSize> pool{};
  std::uint32_t hash_const = kInitA;
  for (std::size_t i = 0; i < kPoolSize; ++i) {
    pool[i] = hashmix(i < entropy_words.size() ? entropy_words[i] : 0U, hash_const);
  }
  for (std::size_t src = 0; src < kPoolSize; ++src) {
    for (std::size_t dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    }
  }
  for (std::size_t src = kPoolSize; src < entropy_words.size(); ++src) {
    for (std::size_t dst = 0; dst < kPoolSize; ++dst) {
      pool[dst] = mix(pool[dst], hashmix(entropy_words[src], hash_const));
    }
  }
  // generate_state(4, uint64): eight 32-bit words cycling over the pool, paired little-endian.
  std::array<std::uint32_t, 2 * kPoolSize> words{};
  std::uint32_t out_const = kInitB;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::uint32_t value = pool[i % kPoolSize];
    value ^= out_const;
    out_const *= kMultB;
    value *= out_const;
    value ^= value >> kXShift;
    words[i] = value;
  }
  std::array<std::uint64_t, 4> state{};
  for (std::size_t k = 0; k < state.size(); ++k) {
    state[k] = static_cast<std::uint64_t>(words[2 * k]) |
               (static_cast<std::uint64_t>(words[2 * k + 1]) << 32);
  }
  return state;
}

Pcg64::Pcg64(const std::array<std::uint64_t, 4>& seed_state) {
  // pcg_setseq_128_srandom_r: state 0, pick the stream, step, add the initial state, step.
  const Uint128 initial = (static_cast<Uint128>(seed_state[0]) << 64) | seed_state[1];
  const Uint128 sequence = (static_cast<Uint128>(seed_state[2]) << 64) | seed_state[3];
  state_ = 0;
  increment_ = (sequence << 1) | 1U;
  state_ = state_ * kMultiplier + increment_;
  state_ += initial;
  state_ = state_ * kMultiplier + increment_;
}

void numpy_shuffle(Pcg64& rng, std::span<std::int64_t> items) {
  if (items.size() < 2) return;
  std::size_t i = items.size() - 1;  // the next index to swap, counting down to 1
  for (; i > 0xFFFFFFFFULL; --i) std::swap(items[i], items[rng.interval(i)]);
  // The draws do not depend on the data, so draw a block of partners ahead and prefetch them: the
  // swaps then hit cache instead of waiting on one random miss each (same swaps, same order).
  constexpr std::size_t kAhead = 32;
  std::array<std::size_t, kAhead> partners{};
  while (i >= kAhead) {
    for (std::size_t k = 0; k < kAhead; ++k) {
      partners[k] = static_cast<std::size_t>(rng.interval(i - k));
      __builtin_prefetch(&items[partners[k]], 1);
    }
    for (std::size_t k = 0; k < kAhead; ++k) std::swap(items[i - k], items[partners[k]]);
    i -= kAhead;
  }
  for (; i >= 1; --i) std::swap(items[i], items[rng.interval(i)]);
}

std::vector<std::int64_t> numpy_permutation(std::span<const std::uint32_t> seed_words,
                                            std::int64_t n) {
  require(n >= 0, ErrorKind::kInvalidArgument,
          "permutation size must be non-negative, got " + std::to_string(n));
  std::vector<std::int64_t> items(static_cast<std::size_t>(n));
  std::iota(items.begin(), items.end(), std::int64_t{0});
  Pcg64 rng(seed_sequence_state(seed_words));
  numpy_shuffle(rng, items);
  return items;
}

std::vector<std::int64_t> numpy_permutation(std::uint64_t seed, std::int64_t n) {
  return numpy_permutation(seed_words(seed), n);
}

std::vector<std::int64_t> numpy_permutation_of(std::span<const std::uint32_t> seed_words,
                                               std::span<const std::int64_t> items) {
  std::vector<std::int64_t> shuffled(items.begin(), items.end());
  Pcg64 rng(seed_sequence_state(seed_words));
  numpy_shuffle(rng, shuffled);
  return shuffled;
}

}  // namespace draftfeed
