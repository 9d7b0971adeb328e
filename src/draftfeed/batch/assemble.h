// Assembly of one batch (docs/formats.md, "One batch") into its preallocated buffer, in three steps
// the pipeline runs:
//   1. `place_samples` (serial, cheap): after fetching, decide where each usable sample's rows go,
//      exactly as the reference collate packs them (dropped samples leave no gap; the sample
//      crossing `max_len` is truncated; later ones are left out);
//   2. `copy_sample_rows` (parallel, in chunks): the hidden-state rows of one placed sample, with
//   cast,
//      noise and finiteness check fused (hidden_copy.h);
//   3. `finish_batch` (serial, small): token ids, loss mask, positions, document ids, zeroed tails.
// If step 2 finds non-finite values the pipeline marks that sample unusable and repeats 1-3 (rare).
// Values are checked where they are copied, so NaN/Inf only in rows truncated away at max_len (or
// in the row the EAGLE-3 shift drops) does not drop the sample; the reference checks cached files
// not at all.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/sample/fetched_sample.h"

namespace draftfeed {

// Rows a sample of `tokens` tokens contributes after the preprocess (the EAGLE-3 shift drops one).
std::int64_t sample_rows_after_preprocess(Preprocess preprocess, std::int64_t tokens);

struct SamplePlacement {
  std::size_t sample = 0;    // index in the batch's plan order
  std::int64_t dst_row = 0;  // first row in the batch
  std::int64_t rows = 0;     // rows copied (may be fewer than the sample has: truncation)
};

struct BatchPlacement {
  std::vector<SamplePlacement> samples;  // usable samples that got rows, in plan order
  std::vector<std::int64_t> documents;   // document lengths, as the reference's `lengths`
  std::int64_t used_rows = 0;
  bool locally_empty = false;  // no usable sample: the all-padding batch
};

// `rows[i]` is sample i's row count after preprocess; `usable[i]` 0 for dropped samples (bytes,
// not vector<bool>: fetch tasks write their own entries concurrently).
BatchPlacement place_samples(std::int64_t max_len, const std::vector<std::int64_t>& rows,
                             const std::vector<std::uint8_t>& usable);

// Preprocess::kCustom: every usable sample with all its rows, back to back (nothing truncated:
// the callable may change row counts, the packing after it truncates). `used_rows` may exceed the
// batch's max_len; `documents` is empty.
BatchPlacement place_unpacked(const std::vector<std::int64_t>& rows,
                              const std::vector<std::uint8_t>& usable);

struct NoiseContext {
  bool enabled = false;  // the pipeline applies the spec's noise (PipelineOptions::noise)
  std::uint64_t epoch = 0;
};

// Copies rows [first, last) (relative to the placement) of a sample's hidden states `hs` into the
// batch `batch` laid out by `layout`; `global_row` keys the noise. `hs` may hold only part of the
// sample's tokens, from token `view_first` on (a chunk read from its file into a staging buffer):
// it must then hold tokens [first, last + the preprocess's shift), or up to the sample's end.
// Returns non-finite elements seen.
std::int64_t copy_sample_rows(const BatchLayout& layout, const BatchMemory& batch,
                              const SamplePlacement& placement, const HiddenStatesView& hs,
                              std::int64_t global_row, const NoiseContext& noise,
                              std::int64_t first, std::int64_t last, std::int64_t view_first = 0);

// Sets the training noise of a sample's target-layer rows from token `first` on in `job`
// (nothing when this batch is not noised): the noise is keyed by seed, epoch, `global_row` and
// token, so the same sample gets the same noise whichever way its rows are copied.
void set_target_noise(RowCopy& job, const BatchSpec& spec, const NoiseContext& noise,
                      std::int64_t global_row, std::int64_t first);

// Tokens the EAGLE-3 preprocess reads past a copied row (the verifier's last layer is shifted by
// one token), 0 otherwise.
std::int64_t copy_row_lookahead(const BatchSpec& spec);

// Writes the integer tensors of every placed sample, document ids, and zeros every tensor's rows
// past `used_rows`. `ids[i]`/`masks[i]` are sample i's dataset row views (plan order). Under
// Preprocess::kCustom only the samples' own rows are written (no document ids, no padding).
// The views' values lie in the dataset's mapped shards: they are read under one fault guard for
// the whole batch (one system call per batch, not per row). When a shard shrank under the batch
// (SIGBUS), nothing else is written and the answer is the placed sample (an index into
// `placement.samples`) whose values could not be read, for the caller to drop.
struct UnreadableSample {
  std::size_t placed = 0;
  const char* column = "input_ids";  // or "loss_mask"
};
std::optional<UnreadableSample> finish_batch(const BatchLayout& layout, const BatchMemory& batch,
                                             const BatchPlacement& placement,
                                             const std::vector<IntArrayView>& ids,
                                             const std::vector<IntArrayView>& masks);

}  // namespace draftfeed
