#include "draftfeed/sampler/multipack.h"

#include <algorithm>
#include <limits>
#include <string>

#include "draftfeed/common/error.h"
#include "draftfeed/sampler/numpy_random.h"

namespace draftfeed {

namespace {

// With kMaxPlanLength (multipack.h): limits that let a bin's (fill, slot) pair live in one 64-bit
// heap key and a window position and length share one 64-bit sort key; far beyond any real batch.
constexpr int kMaxWorldSize = 1 << 20;

int bit_width_of(std::uint64_t value) {
  int bits = 0;
  while (value != 0) {
    ++bits;
    value >>= 1;
  }
  return bits;
}

void check_options(std::span<const std::int64_t> lengths, const PlanOptions& options,
                   std::int64_t epoch) {
  options.validate();
  require(epoch >= 0, ErrorKind::kInvalidArgument,
          "plan: epoch must be non-negative, got " + std::to_string(epoch));
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0) {
      throw Error(ErrorKind::kInvalidArgument, "plan: sample " + std::to_string(i) +
                                                   " has a negative length " +
                                                   std::to_string(lengths[i]));
    }
  }
}

// The epoch's shuffled samples: original indices and their (clipped) lengths, with prefix sums.
struct EpochOrder {
  std::vector<std::int64_t> indices;
  std::vector<std::int64_t> lengths;
  std::vector<std::int64_t> cumsum;
};

EpochOrder shuffle_epoch(std::span<const std::int64_t> lengths, const PlanOptions& options,
                         std::int64_t epoch, PlanCounts& counts) {
  EpochOrder order;
  counts.num_samples = static_cast<std::int64_t>(lengths.size());
  order.indices.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const bool is_long = lengths[i] > options.max_len;
    counts.num_long += is_long ? 1 : 0;
    if (!is_long || options.truncate) order.indices.push_back(static_cast<std::int64_t>(i));
  }
  counts.dropped_long = options.truncate ? 0 : counts.num_long;

  // numpy's default_rng(seed + epoch) takes the exact sum, however large.
  const Uint128 epoch_seed = static_cast<Uint128>(options.seed) + static_cast<Uint128>(epoch);
  Pcg64 rng(seed_sequence_state(seed_words(epoch_seed)));
  numpy_shuffle(rng, order.indices);

  order.lengths.resize(order.indices.size());
  order.cumsum.resize(order.indices.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < order.indices.size(); ++i) {
    const std::int64_t length =
        std::min(lengths[static_cast<std::size_t>(order.indices[i])], options.max_len);
    order.lengths[i] = length;
    if (__builtin_add_overflow(total, length, &total)) {
      throw Error(
          ErrorKind::kInvalidArgument,
          "plan: the lengths' sum overflows int64 at shuffled position " + std::to_string(i));
    }
    order.cumsum[i] = total;
  }
  return order;
}

// Plans one epoch. Scratch buffers live here so windows reuse them without reallocating.
class Planner {
 public:
  // `only_rank` < 0 collects every rank's batches, else only that rank's.
  Planner(const PlanOptions& options, int only_rank)
      : options_(options),
        world_size_(options.world_size),
        only_rank_(only_rank),
        slot_bits_(bit_width_of(static_cast<std::uint64_t>(options.world_size - 1))),
        heap_(static_cast<std::size_t>(options.world_size) + 1,
              std::numeric_limits<std::uint64_t>::max()) {}

  void run(const EpochOrder& order, std::vector<RankPlan>& ranks, PlanCounts& counts) {
    const auto n = static_cast<std::int64_t>(order.indices.size());
    const std::int64_t capacity = options_.max_len * world_size_;
    std::int64_t ind = 0;
    std::int64_t batch_no = 0;
    bool cut = false;
    while (n - ind >= world_size_) {
      if (options_.max_batches && batch_no >= *options_.max_batches) {
        cut = true;
        break;
      }
      // Upper bound of the search: the longest prefix whose tokens fit in all bins together.
      const std::int64_t before = ind == 0 ? 0 : order.cumsum[static_cast<std::size_t>(ind - 1)];
      const auto* first = order.cumsum.data() + ind;
      const std::int64_t limit = before > std::numeric_limits<std::int64_t>::max() - capacity
                                     ? std::numeric_limits<std::int64_t>::max()
                                     : before + capacity;
      const auto* fits_end = std::upper_bound(first, order.cumsum.data() + n, limit);
      const std::int64_t max_count = fits_end - first;
      sort_window(order.lengths.data() + ind, max_count);

      std::int64_t left = 1;
      std::int64_t right = 1 + max_count;
      bool left_packed = false;  // accepted_slots_ holds the packing of `left` samples
      while (right - left > 1 && right > world_size_) {
        const std::int64_t mid = (left + right) / 2;
        if (pack(mid, trial_slots_)) {
          left = mid;
          std::swap(trial_slots_, accepted_slots_);
          left_packed = true;
        } else {
          right = mid;
        }
      }
      if (!left_packed) {
        // One sample always fits (lengths are at most max_len), and so does any size that passed.
        const bool packed = pack(left, accepted_slots_);
        (void)packed;
      }
      emit(order, ind, left, batch_no, ranks);
      ind += left;
      ++batch_no;
    }
    const std::int64_t rest = n - ind;
    (cut ? counts.cut_by_max_batches : counts.dropped_tail) = rest;
    counts.planned = ind;
  }

 private:
  // Orders positions [0, count) of the window by descending length, later position first on ties.
  void sort_window(const std::int64_t* window_lengths, std::int64_t count) {
    sorted_pos_.resize(static_cast<std::size_t>(count));
    sorted_len_.resize(static_cast<std::size_t>(count));
    const int pos_bits = bit_width_of(static_cast<std::uint64_t>(count));
    if (pos_bits + bit_width_of(static_cast<std::uint64_t>(options_.max_len)) <= 64) {
      // Fast path: one integer key per item; sorting keys descending gives length desc, pos desc.
      keys_.resize(static_cast<std::size_t>(count));
      for (std::int64_t p = 0; p < count; ++p) {
        keys_[static_cast<std::size_t>(p)] =
            (static_cast<std::uint64_t>(window_lengths[p]) << pos_bits) |
            static_cast<std::uint64_t>(p);
      }
      std::sort(keys_.begin(), keys_.end(), std::greater<>());
      const std::uint64_t pos_mask = (std::uint64_t{1} << pos_bits) - 1;
      for (std::size_t t = 0; t < keys_.size(); ++t) {
        const auto pos = static_cast<std::int64_t>(keys_[t] & pos_mask);
        sorted_pos_[t] = pos;
        sorted_len_[t] = window_lengths[pos];
      }
      return;
    }
    for (std::int64_t p = 0; p < count; ++p) sorted_pos_[static_cast<std::size_t>(p)] = p;
    std::sort(sorted_pos_.begin(), sorted_pos_.end(), [&](std::int64_t a, std::int64_t b) {
      return window_lengths[a] != window_lengths[b] ? window_lengths[a] > window_lengths[b] : a > b;
    });
    for (std::size_t t = 0; t < sorted_pos_.size(); ++t) {
      sorted_len_[t] = window_lengths[sorted_pos_[t]];
    }
  }

  // LPT over the window's first `count` positions, longest first, each into the bin with the
  // smallest (fill, slot). Records each visited item's slot; false when an item does not fit.
  bool pack(std::int64_t count, std::vector<int>& slots) {
    // The probe's lengths in visiting order, compacted without branches: positions >= count are
    // scattered at random, so a branch per item would be mispredicted half the time.
    probe_len_.resize(sorted_pos_.size());
    std::size_t num_items = 0;
    for (std::size_t t = 0; t < sorted_pos_.size(); ++t) {
      probe_len_[num_items] = sorted_len_[t];
      num_items += sorted_pos_[t] < count ? 1 : 0;
    }
    // A bin is the key fill << slot_bits | slot, so the smallest key is the smallest (fill, slot).
    const std::uint64_t slot_mask = (std::uint64_t{1} << slot_bits_) - 1;
    const auto max_len = static_cast<std::uint64_t>(options_.max_len);
    slots.resize(num_items);
    const std::size_t first = place_largest(num_items, slots);
    for (std::size_t i = first; i < num_items; ++i) {
      const std::uint64_t top = heap_[0];
      const std::uint64_t fill = (top >> slot_bits_) + static_cast<std::uint64_t>(probe_len_[i]);
      if (fill > max_len) return false;
      slots[i] = static_cast<int>(top & slot_mask);
      replace_top((fill << slot_bits_) | (top & slot_mask));
    }
    return true;
  }

  // LPT's first steps without the heap: while some bin is empty, the next item (longest first, so
  // every earlier one was longer than zero) goes to the lowest empty slot, i.e. item i to slot i.
  // Builds the heap those steps leave and returns how many items were placed. Lengths are at most
  // max_len, so these never fail.
  std::size_t place_largest(std::size_t num_items, std::vector<int>& slots) {
    const auto world = static_cast<std::size_t>(world_size_);
    std::size_t placed = 0;
    while (placed < num_items && placed < world && probe_len_[placed] > 0) {
      slots[placed] = static_cast<int>(placed);
      ++placed;
    }
    // Ascending keys form a heap: first the empty slots, then the filled ones by ascending fill.
    // Fills do not increase with the slot, so walk slots downwards, keeping equal fills in
    // ascending slot order.
    std::size_t out = 0;
    for (std::size_t s = placed; s < world; ++s) heap_[out++] = s;
    std::size_t group_end = placed;  // slots [group_begin, group_end) share one fill
    while (group_end > 0) {
      std::size_t group_begin = group_end - 1;
      while (group_begin > 0 && probe_len_[group_begin - 1] == probe_len_[group_end - 1]) {
        --group_begin;
      }
      const auto fill = static_cast<std::uint64_t>(probe_len_[group_begin]);
      for (std::size_t s = group_begin; s < group_end; ++s) heap_[out++] = (fill << slot_bits_) | s;
      group_end = group_begin;
    }
    return placed;
  }

  // Replaces the heap's root with `key` (never smaller than it). Floyd's order: walk the hole down
  // to a leaf along the smaller children, then lift the key to its place. The new fill is usually
  // among the largest, so this saves a comparison per level; heap_[world_size] is a sentinel.
  // A binary heap: a 4-ary one was slower here.
  void replace_top(std::uint64_t key) {
    const auto world = static_cast<std::size_t>(world_size_);
    std::uint64_t* heap = heap_.data();
    std::size_t hole = 0;
    for (std::size_t child = 1; child < world; child = 2 * hole + 1) {
      child += heap[child + 1] < heap[child] ? 1 : 0;
      heap[hole] = heap[child];
      hole = child;
    }
    while (hole > 0) {
      const std::size_t parent = (hole - 1) / 2;
      if (heap[parent] < key) break;
      heap[hole] = heap[parent];
      hole = parent;
    }
    heap[hole] = key;
  }

  // The window's positions [0, count) in LPT's visiting order: `options_.window_order`'s when
  // given, else ours (sorted_pos_ without the positions past `count`).
  const std::vector<std::int64_t>& visiting_order(const EpochOrder& order, std::int64_t ind,
                                                  std::int64_t count) {
    const std::span<const std::int64_t> window(order.lengths.data() + ind,
                                               static_cast<std::size_t>(count));
    visit_.clear();
    bool ties = false;
    for (const std::int64_t pos : sorted_pos_) {
      if (pos >= count) continue;
      ties = ties || (!visit_.empty() && window[static_cast<std::size_t>(visit_.back())] ==
                                             window[static_cast<std::size_t>(pos)]);
      visit_.push_back(pos);
    }
    // Without equal lengths every sort gives this order: no need to ask.
    if (!options_.window_order || !ties) return visit_;
    visit_.clear();
    ascending_.assign(static_cast<std::size_t>(count), -1);
    options_.window_order(window, ascending_);
    // Any order of equal lengths packs the same sizes in the same sequence, so the slots found
    // with our order hold; anything else would silently misassign samples, so it is checked.
    seen_.assign(static_cast<std::size_t>(count), 0);
    for (std::size_t t = ascending_.size(); t-- > 0;) {
      const std::int64_t pos = ascending_[t];
      const bool valid = pos >= 0 && pos < count && seen_[static_cast<std::size_t>(pos)] == 0;
      const bool descending = visit_.empty() || window[static_cast<std::size_t>(visit_.back())] >=
                                                    window[static_cast<std::size_t>(pos)];
      if (!valid || !descending) {
        throw Error(ErrorKind::kRuntime,
                    "plan: window_order did not give an ascending order of the window's " +
                        std::to_string(count) + " lengths (position " + std::to_string(t) +
                        " holds " + std::to_string(pos) + ")");
      }
      seen_[static_cast<std::size_t>(pos)] = 1;
      visit_.push_back(pos);
    }
    return visit_;
  }

  // Appends the accepted packing of `count` samples starting at shuffled position `ind` as batch
  // `batch_no`: slot s goes to rank (s + batch_no) mod world_size, in packing order.
  void emit(const EpochOrder& order, std::int64_t ind, std::int64_t count, std::int64_t batch_no,
            std::vector<RankPlan>& ranks) {
    const std::int64_t rotation = batch_no % world_size_;
    const std::vector<std::int64_t>& visit = visiting_order(order, ind, count);
    for (std::size_t t = 0; t < visit.size(); ++t) {
      const std::int64_t rank = (accepted_slots_[t] + rotation) % world_size_;
      const std::int64_t sample = order.indices[static_cast<std::size_t>(ind + visit[t])];
      if (only_rank_ < 0) {
        ranks[static_cast<std::size_t>(rank)].samples.push_back(sample);
      } else if (rank == only_rank_) {
        ranks[0].samples.push_back(sample);
      }
    }
    for (auto& plan : ranks) {
      plan.batch_offsets.push_back(static_cast<std::int64_t>(plan.samples.size()));
    }
  }

  const PlanOptions& options_;
  const std::int64_t world_size_;
  const int only_rank_;
  const int slot_bits_;
  std::vector<std::uint64_t> heap_;
  std::vector<std::uint64_t> keys_;
  std::vector<std::int64_t> sorted_pos_;
  std::vector<std::int64_t> sorted_len_;
  std::vector<std::int64_t> probe_len_;
  std::vector<int> trial_slots_;
  std::vector<int> accepted_slots_;
  std::vector<std::int64_t> visit_;      // the final window's visiting order
  std::vector<std::int64_t> ascending_;  // window_order's answer
  std::vector<std::uint8_t> seen_;
};

void reserve_for(std::vector<RankPlan>& ranks, std::int64_t samples_each) {
  for (auto& plan : ranks) plan.samples.reserve(static_cast<std::size_t>(samples_each));
}

}  // namespace

void PlanOptions::validate() const {
  require(max_len >= 1 && max_len < kMaxPlanLength, ErrorKind::kInvalidArgument,
          "plan: max_len must be in [1, 2^40), got " + std::to_string(max_len));
  require(world_size >= 1 && world_size <= kMaxWorldSize, ErrorKind::kInvalidArgument,
          "plan: world_size must be in [1, 2^20], got " + std::to_string(world_size));
  require(!max_batches || *max_batches >= 0, ErrorKind::kInvalidArgument,
          "plan: max_batches must be non-negative, got " + std::to_string(max_batches.value_or(0)));
}

AllRanksPlan plan_all_ranks(std::span<const std::int64_t> lengths, const PlanOptions& options,
                            std::int64_t epoch) {
  check_options(lengths, options, epoch);
  AllRanksPlan plan;
  const EpochOrder order = shuffle_epoch(lengths, options, epoch, plan.counts);
  plan.ranks.resize(static_cast<std::size_t>(options.world_size));
  reserve_for(plan.ranks,
              static_cast<std::int64_t>(order.indices.size()) / options.world_size + 1024);
  Planner(options, -1).run(order, plan.ranks, plan.counts);
  plan.num_batches = plan.ranks[0].num_batches();
  return plan;
}

RankPlan plan_rank(std::span<const std::int64_t> lengths, const PlanOptions& options, int rank,
                   std::int64_t epoch, PlanCounts* counts) {
  check_options(lengths, options, epoch);
  require(rank >= 0 && rank < options.world_size, ErrorKind::kInvalidArgument,
          "plan: rank " + std::to_string(rank) +
              " is outside [0, world_size=" + std::to_string(options.world_size) + ")");
  PlanCounts local_counts;
  PlanCounts& out_counts = counts != nullptr ? *counts : local_counts;
  out_counts = PlanCounts{};
  const EpochOrder order = shuffle_epoch(lengths, options, epoch, out_counts);
  std::vector<RankPlan> ranks(1);
  reserve_for(ranks, static_cast<std::int64_t>(order.indices.size()) / options.world_size + 1024);
  Planner(options, rank).run(order, ranks, out_counts);
  return std::move(ranks[0]);
}

}  // namespace draftfeed
