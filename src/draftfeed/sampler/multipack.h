// The multipack batch planner (docs/sampler.md): which samples each data-parallel rank trains on in
// each batch of an epoch, identical to speculators' MultipackDistributedBatchSamplerV2.
//
// Per epoch the valid samples are shuffled with numpy's permutation (seed + epoch), then cut into
// consecutive windows. For each window a binary search finds the longest prefix of the remaining
// shuffled samples that LPT (longest first, into the least-filled of `world_size` bins of capacity
// `max_len`) can pack; bin `slot` of batch `b` goes to rank `(slot + b) mod world_size`. Fewer than
// `world_size` samples left at the end are dropped. Every rank gets the same number of batches.
//
// Ties: the reference visits each window by `numpy.argsort(lengths)[::-1]`, numpy's default
// (unstable) sort, whose order of equal lengths depends on numpy's build and the CPU's SIMD sort:
// only numpy itself reproduces it. Whether a window packs does not depend on the order of equal
// lengths (the same sizes arrive in the same order), only which rank gets which of them does. So
// the binary search runs on an order of our own, and the final window of each batch is visited in
// the order `PlanOptions::window_order` gives (the Python bindings pass numpy's argsort: one call
// per batch). Without it, equal lengths go later position first (a stable ascending sort,
// reversed): the batch count and each rank's multiset of lengths match the reference, the exact
// indices of tied samples may not.
//
// Indices are positions in the `lengths` span given (local to a split; the caller maps them to
// global rows). Thread safety: the functions are pure and may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace draftfeed {

// Fills `order` with the positions of `lengths` in ascending length order (numpy.argsort's
// contract); the planner visits them backwards. Must be a permutation of [0, lengths.size()).
using WindowOrder =
    std::function<void(std::span<const std::int64_t> lengths, std::span<std::int64_t> order)>;

// The planner's bound on max_len (a batch's tokens): a bin's fill and slot share one 64-bit key.
inline constexpr std::int64_t kMaxPlanLength = std::int64_t{1} << 40;

struct PlanOptions {
  std::int64_t max_len = 8192;  // token capacity of one rank's batch (total_seq_len)
  int world_size = 1;           // data-parallel ranks
  std::uint64_t seed = 0;       // the epoch's shuffle uses numpy's default_rng(seed + epoch)
  bool truncate = true;         // long samples: clip their length to max_len (true) or drop (false)
  std::optional<std::int64_t> max_batches;  // keep only the first max_batches batches per rank
  WindowOrder window_order;  // how each batch's final window orders ties (see above); may be empty

  // The only check of these fields (Error kInvalidArgument naming the field): max_len in
  // [1, 2^40), world_size in [1, 2^20], max_batches >= 0.
  void validate() const;
};

// The planner's options a loader holds beside the batch's length and the seed, which it holds
// once elsewhere (LoaderOptions: batch.max_len, batch.noise.seed); with() makes the full options.
struct PlanLimits {
  int world_size = 1;
  bool truncate = true;
  std::optional<std::int64_t> max_batches;

  PlanOptions with(std::int64_t max_len, std::uint64_t seed) const {
    PlanOptions options;
    options.max_len = max_len;
    options.world_size = world_size;
    options.seed = seed;
    options.truncate = truncate;
    options.max_batches = max_batches;
    return options;
  }
};

// One rank's batches, stored back to back: batch b is samples[batch_offsets[b] ..
// batch_offsets[b+1]).
struct RankPlan {
  std::vector<std::int64_t> samples;
  std::vector<std::int64_t> batch_offsets{0};

  std::int64_t num_batches() const { return static_cast<std::int64_t>(batch_offsets.size()) - 1; }
  std::span<const std::int64_t> batch(std::int64_t b) const {
    const auto begin = static_cast<std::size_t>(batch_offsets[static_cast<std::size_t>(b)]);
    const auto end = static_cast<std::size_t>(batch_offsets[static_cast<std::size_t>(b) + 1]);
    return std::span<const std::int64_t>(samples).subspan(begin, end - begin);
  }
};

// What happened to the samples of one epoch's plan.
struct PlanCounts {
  std::int64_t num_samples = 0;         // lengths given
  std::int64_t num_long = 0;            // longer than max_len (clipped when truncating)
  std::int64_t dropped_long = 0;        // long samples left out (drop mode)
  std::int64_t dropped_tail = 0;        // fewer than world_size left at the end of the epoch
  std::int64_t cut_by_max_batches = 0;  // not planned because max_batches was reached
  std::int64_t planned = 0;             // samples in some rank's batch
};

// Each count under its reported name (common/stats_tree.h): the Python plan's dict.
template <typename Visit>
void for_each_stat(const PlanCounts& c, Visit&& visit) {
  visit("num_samples", c.num_samples);
  visit("num_long", c.num_long);
  visit("dropped_long", c.dropped_long);
  visit("dropped_tail", c.dropped_tail);
  visit("cut_by_max_batches", c.cut_by_max_batches);
  visit("planned", c.planned);
}

struct AllRanksPlan {
  std::int64_t num_batches = 0;  // the same on every rank
  std::vector<RankPlan> ranks;   // index = rank
  PlanCounts counts;
};

// Every rank's batches for `epoch`, in one pass (the packing is shared by all ranks).
// Throws Error(kInvalidArgument) for a negative length, max_len < 1, world_size < 1, epoch < 0,
// max_batches < 0, or sizes whose token capacity (max_len * world_size) overflows, and
// Error(kRuntime) when `window_order` gives something other than an ascending permutation.
// Whatever `window_order` throws passes through.
AllRanksPlan plan_all_ranks(std::span<const std::int64_t> lengths, const PlanOptions& options,
                            std::int64_t epoch);

// One rank's batches for `epoch` (the reference sampler's `_generate_batches(epoch)` on `rank`).
// Same errors as plan_all_ranks, and rank outside [0, world_size). `counts`, when given, is filled.
RankPlan plan_rank(std::span<const std::int64_t> lengths, const PlanOptions& options, int rank,
                   std::int64_t epoch, PlanCounts* counts = nullptr);

}  // namespace draftfeed
