// Synthetic hidden-state caches for demos, tests and benchmarks (`draftfeed synth`).
//
// Row r gets `<root>/hs_<r>.safetensors` with `token_ids` = the row's ids (I64 [T]) and
// `hidden_states` [T, L, H] in the chosen dtype, every value a function of (seed, row, position,
// layer, h) alone, so tests can recompute any element:
//
//   mix(z)  = splitmix64's finaliser on uint64 (wrapping arithmetic):
//             z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
//             z ^= z >> 31
//   base    = mix(mix(mix(mix(seed) ^ row) ^ position) ^ layer)
//   value   = (int64(mix(base ^ h) >> 57) - 64) / 16
//
// i.e. one of the 128 multiples of 1/16 in [-4, 3.9375]: exactly representable in BF16, F16 and
// F32, so every dtype holds the same numbers. Files are written atomically (temporary + rename).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

struct SyntheticHiddenStateSpec {
  std::uint64_t seed = 0;
  std::int64_t hidden_size = 64;
  std::int64_t layers = 4;
  DType dtype = DType::kBF16;  // BF16, F16 or F32
  unsigned threads = 0;        // 0: one per core
};

// The value of element [position, layer, h] of row `row` (see the formula above).
float synthetic_hidden_value(std::uint64_t seed, std::int64_t row, std::int64_t position,
                             std::int64_t layer, std::int64_t h);

// Fills `out` (row's ids) for a row; called from several threads at once.
using RowIdsFn = std::function<void(std::int64_t row, std::vector<std::int64_t>& out)>;

struct SyntheticCacheStats {
  std::int64_t files = 0;
  std::uint64_t bytes = 0;  // tensor bytes written (headers not counted)
};

// Writes rows [0, num_rows) into `root` (created if needed), in parallel. Throws Error:
// kInvalidArgument for a bad spec (non-positive sizes, a dtype other than BF16/F16/F32),
// kIo when a file cannot be written (naming it).
SyntheticCacheStats write_synthetic_hidden_states(const std::string& root, std::int64_t num_rows,
                                                  const RowIdsFn& ids_of_row,
                                                  const SyntheticHiddenStateSpec& spec);

// Same, with the rows' ids given.
SyntheticCacheStats write_synthetic_hidden_states(const std::string& root,
                                                  std::span<const std::vector<std::int64_t>> rows,
                                                  const SyntheticHiddenStateSpec& spec);

}  // namespace draftfeed
