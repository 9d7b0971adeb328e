// A deterministic synthetic token dataset: every value is a pure function of (seed, row, position),
// so other stages (e.g. synthetic hidden-state files) can regenerate any row without reading it.
//
// The functions, exactly (all arithmetic on uint64, wrapping):
//   mix64(z)    = splitmix64 (common/hash.h): z += 0x9E3779B97F4A7C15;
//                 z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) *
//                 0x94D049BB133111EB; return z ^ (z >> 31)
//   synthetic_hash(seed, stream, row, position)
//               = mix64(mix64(mix64(seed ^ (stream * 0xD1B54A32D192ED03)) ^ row) ^ position)
//   length(row)    = min_len + synthetic_hash(seed, kStreamLength, row, 0)
//                    % (max_len - min_len + 1)
//   token(row, t)  = synthetic_hash(seed, kStreamToken, row, t) % vocab
//   prompt(row)    = synthetic_hash(seed, kStreamPrompt, row, 0) % (length(row) / 2 + 1)
//   loss_mask(row, t) = t >= prompt(row) ? 1 : 0   (a prompt of zeros, then ones)
// Streams 0..15 are reserved for the dataset; other stages pick their own stream numbers >= 16.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "draftfeed/dataset/dataset_writer.h"

namespace draftfeed {

struct SyntheticOptions {
  std::int64_t rows = 1000;
  std::uint64_t seed = 0;
  std::int64_t min_len = 32;
  std::int64_t max_len = 512;
  std::int64_t vocab = 32000;
};

inline constexpr std::uint64_t kStreamLength = 1;
inline constexpr std::uint64_t kStreamToken = 2;
inline constexpr std::uint64_t kStreamPrompt = 3;

std::uint64_t synthetic_hash(std::uint64_t seed, std::uint64_t stream, std::uint64_t row,
                             std::uint64_t position);

// Throws Error(kInvalidArgument) unless rows >= 0, 0 <= min_len <= max_len, vocab >= 1.
void validate(const SyntheticOptions& options);

std::int64_t synthetic_row_length(const SyntheticOptions& options, std::int64_t row);
std::int64_t synthetic_token(const SyntheticOptions& options, std::int64_t row,
                             std::int64_t position);
std::int64_t synthetic_loss_mask(const SyntheticOptions& options, std::int64_t row,
                                 std::int64_t position);
// Fills both vectors with row `row` (resized to its length).
void synthetic_row(const SyntheticOptions& options, std::int64_t row,
                   std::vector<std::int64_t>* ids, std::vector<std::int64_t>* loss_mask);

// Writes rows [0, options.rows) to `folder` with a DatasetWriter (`writer.total_rows` is set).
DatasetWriteSummary write_synthetic_dataset(const std::string& folder,
                                            const SyntheticOptions& options,
                                            DatasetWriterOptions writer = {});

}  // namespace draftfeed
