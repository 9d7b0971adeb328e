// The order in which the lookahead (lookahead_source.h) starts the rows it was told are coming:
// each row as late as it can start and still be there when its batch is due, the longest first
// among equals, so that a long request is not left for the end of an epoch.
//
// Why: fetching in plan order is list scheduling with unknown durations, which only guarantees
// (total service / slots) + the longest request; a heavy-tailed request late in an epoch's order
// ends the epoch long after every other slot went idle. A scheduler can know three things: the
// plan (the batches of this epoch and of the next, deterministic from the seed), the prompts'
// lengths (a vLLM server's prefill time grows with them) and the service times it observed
// (service_time_model.h). From them each row gets a deadline, the ideal time its batch is due
// (the predicted work of the plan up to and including its batch, over the slots), and a key:
//
//   key = deadline - slack x predicted time,   slack = max(kSlack, the model's tail_factor())
//
// Rows start in key order (least slack first). With a slack of 1 the key is the latest start that
// meets the deadline; a larger slack starts long rows earlier still, which keeps the last rows of
// an epoch short (a request's unpredictable part then costs little at the end) at the price of
// holding long rows' samples longer (bounded by the lookahead's window and byte budget). The
// poorer the predictions (a heavy tail no prompt announces), the larger the slack.
//
// Plans belong to streams (one per loader sharing the source: training and validation), each
// with the batches due now and optionally the plan after (the next epoch's). Tiers order them:
// the stream planned last has its current plan in tier 0; everything else (its next plan, other
// streams' plans) is in tier 1, started only when no tier-0 row waits. A row a consumer already
// waits for (claimed) may start ahead of the budget (the caller's `fits`), in key order among the
// claimed ones, so a full budget never blocks the batch being assembled; and it is started by the
// lookahead, not by the consumer, so that the consumer's plan order does not take the slots.
//
// Not thread-safe: the lookahead calls it under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "draftfeed/read_ahead/service_time_model.h"

namespace draftfeed {

class FetchSchedule {
 public:
  static constexpr double kSlack = 8.0;

  struct Row {
    std::int64_t row = 0;
    std::int64_t tokens = 0;
  };
  using Batches = std::vector<std::vector<Row>>;

  struct Item {
    std::int64_t row = 0;
    std::int64_t tokens = 0;
    int stream = 0;
    bool next = false;       // of the stream's next plan
    std::int64_t batch = 0;  // index in its plan
    double key = 0;
    int tier = 1;
    bool claimed = false;
    bool started = false;
    std::uint64_t seq = 0;  // unique, in plan order
  };

  // `slots`: requests in flight at most (the deadlines divide the work by it).
  explicit FetchSchedule(int slots, double slack = kSlack);

  // Replaces `stream`'s plans and makes it the active stream; every row of them is queued.
  void set_plan(int stream, const Batches& batches, const Batches& next,
                const ServiceTimeModel& model);
  void drop_stream(int stream);
  // Recomputes every key from the model's current predictions.
  void rekey(const ServiceTimeModel& model);

  // An occurrence of `row` is served by a sample already there (or under way): its first queued
  // occurrence is taken off the queue. False when none is queued.
  bool mark_started(std::int64_t row);
  // The same, giving the occurrence taken off (requeue() puts it back).
  std::optional<Item> take_row(std::int64_t row);
  // A consumer waits for `row`: its first unclaimed queued occurrence may start ahead of the
  // budget. False when no occurrence is queued.
  bool claim(std::int64_t row);
  // The next row to start, taken off the queue: the earliest of the first claimed row and the
  // queue's head, the head only when `fits(its tokens)`. Nullopt when none may start.
  std::optional<Item> pick(const std::function<bool(std::int64_t tokens)>& fits);
  // Whether pick(fits) would give a row (nothing taken off).
  bool can_pick(const std::function<bool(std::int64_t tokens)>& fits) const;
  // An item whose fetch was interrupted goes back to the queue (unclaimed) if its plan is still
  // there.
  void requeue(const Item& item);

  // Whether an occurrence of `row` is queued.
  bool queued(std::int64_t row) const { return by_row_.count(row) != 0; }
  // Rows queued (claimed ones included).
  std::int64_t queued() const { return static_cast<std::int64_t>(queue_.size() + claimed_.size()); }
  // Occurrences of `row` in every stream's plans, started or not.
  std::int64_t occurrences(std::int64_t row) const;
  // Occurrences of `row` in `stream`'s plans.
  std::int64_t occurrences(int stream, std::int64_t row) const;
  const std::vector<int>& streams() const { return stream_order_; }

 private:
  using Order = std::tuple<int, double, std::uint64_t>;  // tier, key, seq
  static Order order_of(const Item& item) { return {item.tier, item.key, item.seq}; }
  void enqueue(Item& item);
  void dequeue(const Item& item);
  void compute_keys(int stream, const ServiceTimeModel& model);

  const int slots_;
  const double slack_;
  std::uint64_t next_seq_ = 0;
  std::vector<int> stream_order_;  // least recently planned first; the last is active
  std::unordered_map<int, std::vector<std::uint64_t>> plans_;  // stream -> seqs in plan order
  std::unordered_map<std::uint64_t, Item> items_;
  std::set<Order> queue_;                                       // queued, not claimed
  std::set<Order> claimed_;                                     // queued and claimed
  std::unordered_map<std::int64_t, std::set<Order>> by_row_;    // not started, per row
  std::unordered_map<std::int64_t, std::int64_t> occurrences_;  // every plan, per row
  std::unordered_map<int, std::unordered_map<std::int64_t, std::int64_t>> stream_rows_;
};

}  // namespace draftfeed
