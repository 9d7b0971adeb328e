// The request lookahead (the other read-ahead of read_ahead/, beside file_read_ahead.h): a
// SampleSource that fetches the rows it was told are coming, ahead of the pipeline's requests, with
// its own threads, in the order of a fetch schedule (fetch_schedule.h), holding at most a window of
// rows and a byte budget of fetched samples.
//
// Why: the pipeline takes a batch buffer before fetching a batch's samples, so with in-order
// delivery a batch stuck on one slow request holds every buffer behind it and the requests in
// flight dry up (head-of-line blocking). A fetched sample costs no buffer (it is a mapped file),
// so fetching ahead of the buffers keeps the inner source's requests in flight while the buffers
// wait: the lookahead runs one thread per fetch the inner source may keep blocked
// (SampleSource::blocking_fetches, at least one). And the order matters: a request that takes
// long must start early, not when plan order reaches it (see fetch_schedule.h).
//
// `plan(stream, batches, next)` replaces a stream's plan (a loader's: this epoch's remaining
// batches and, optionally, the next epoch's); the threads start its rows in schedule order while
// the rows fetched and not yet claimed, with those under way, stay within the window (`window`
// rows) and the byte budget:
//   held bytes = sum over samples fetched, unclaimed (their hidden states' bytes)
//              + sum over rows under way (tokens x the largest bytes per token seen so far)
// against the loader's read-ahead budget (a plan's budget_bytes: read_ahead/byte_budget.h, the
// one rule both read-aheads follow), reported as the file read-ahead's is (ReadAheadMemory).
// Of the next plan only the first rows are kept (as many as the window holds, twice over): no more
// of it can start before its epoch does, as nothing of it is claimed before.
//
// `fetch(row)` (a claim) takes the row's fetched sample, waiting if it is under way. A queued row
// already stored (SampleSource::fetch_stored: a cache file) is read by the claim itself, so it
// never waits behind threads held by slow requests; any other queued row is claimed, and the
// lookahead's next free thread starts it ahead of the budget (the consumer's plan order must not
// take the inner source's slots from the schedule); a row no plan holds is fetched inline.
// Samples of rows that a new plan keeps are kept (a next epoch's rows fetched during this epoch's
// last requests serve the next epoch); the others are dropped (their outcomes only hold mappings:
// the inner source already cached or deleted their files), failed outcomes too (they are fetched
// again).
//
// Hedged fetches: a lookahead thread that has nothing to start (no queued row fits, or none is
// left) fetches a row again whose fetch has run `hedge.factor` x its predicted time (and at least
// `hedge.min_wait`: read_ahead/hedge_rule.h), once per row; whichever fetch ends first with a
// sample is the row's, the other is cancelled (cancel_scope.h: the online source ends its request).
// Why: a server's tail (a preempted or queued request) is often a property of the request, not of
// the prompt, and one such request started late holds the epoch's end; a second ask usually takes
// the median. It never adds requests beyond the inner source's bound: the lookahead runs as many
// threads as the inner source has fetches. A thread hedges when it has nothing else to start, one
// hedge at a time; once more hedges have won than lost (the server's slow requests are slow for the
// request's sake, not the prompt's), a due hedge goes before new rows, any number at once. Where
// the slow requests are slow for the prompt's sake (a long prompt, a server's cold cache), hedges
// lose (both asks take long), and after two losses more than wins no more are started; the prompt's
// history then predicts its time in later epochs, so none is due there. Not before the service-time
// model has kMinHedgeObservations (one observation is no median). A hedge that fails leaves the
// row to its first fetch.
//
// The pipeline's stop mid-epoch (interrupt) forgets every plan and interrupts the inner source
// (rows under way end at once and are dropped); resume() waits for the lookahead threads to be
// idle, then resumes the inner source. At an epoch's normal end the pipeline does not interrupt,
// so what was fetched for the next epoch stays.
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/read_ahead/byte_budget.h"
#include "draftfeed/read_ahead/fetch_schedule.h"
#include "draftfeed/read_ahead/hedge_rule.h"
#include "draftfeed/read_ahead/service_time_model.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

struct LookaheadStats {
  std::int64_t queued = 0;             // rows of the plans not started yet
  std::int64_t running = 0;            // rows being fetched by the lookahead threads
  std::int64_t ready = 0;              // rows fetched, not yet claimed
  std::int64_t waiting_claims = 0;     // fetch() calls waiting now for a row to start or end
  std::int64_t hits = 0;               // fetch() calls served by the lookahead
  std::int64_t inline_fetches = 0;     // fetch() calls the lookahead had not started
  std::int64_t stored_reads = 0;       // fetch() calls of queued rows served from the store
  std::int64_t discarded = 0;          // fetched rows never claimed (no plan wanted them any more)
  std::int64_t next_plan_started = 0;  // rows of a next plan (the next epoch's) started
  // Held bytes (the header's formula), at most, the budget; hedges: second fetches started (see
  // the header), won when the second ended first with the sample, lost when the first did.
  ReadAheadMemory memory;
  bool trusts_history = true;  // the service-time model's choice (service_time_model.h)
  double tail_factor = 1;      // and how far off it is
};

// Each statistic under its reported name (common/stats_tree.h).
template <typename Visit>
void for_each_stat(const LookaheadStats& l, Visit&& visit) {
  visit("queued", l.queued);
  visit("running", l.running);
  visit("ready", l.ready);
  visit("waiting_claims", l.waiting_claims);
  visit("hits", l.hits);
  visit("inline_fetches", l.inline_fetches);
  visit("stored_reads", l.stored_reads);
  visit("discarded", l.discarded);
  visit("next_plan_started", l.next_plan_started);
  visit("memory", l.memory);
  visit("trusts_history", l.trusts_history);
  visit("tail_factor", l.tail_factor);
}

// The lookahead's settings, each held here once (the Python OnlineSource's lookahead arguments and
// the command line's --lookahead flags set them).
struct LookaheadOptions {
  // Rows fetched ahead and not yet claimed, with those under way, at most; 0 turns the lookahead
  // off. Unset: kRowsPerFetch x the inner source's blocking fetches (requests in flight) when the
  // rows' dataset is known, else off. Why that many: with in-order delivery the first batch may
  // wait seconds for a long request while the rows behind it fill the window, and fewer rows leave
  // request slots idle (docs/decisions.md).
  std::optional<int> window;
  static constexpr int kRowsPerFetch = 8;
  // x the prompt's predicted service time, and at least min_wait (Python: hedge_factor,
  // hedge_min_seconds); factor 0: no hedged fetches.
  HedgeRule hedge{.factor = 2, .min_wait = std::chrono::duration<double>(1.0)};
  // The loader hands the lookahead the next epoch's batches too (training only): its first
  // requests run while this epoch's last ones are slow. Requests beyond the epoch (wasted after
  // the last one), so off by default.
  bool next_epoch = false;

  // kInvalidArgument naming the field (the Python argument's name).
  void validate() const;
  // The window for an inner source with `blocking_fetches` requests in flight; `has_dataset`:
  // whether the rows' token ids are known (the lookahead needs them).
  int window_for(int blocking_fetches, bool has_dataset) const;
};

class LookaheadSource : public SampleSource {
 public:
  static constexpr std::int64_t kMinHedgeObservations = 8;

  // `options` validated, its window resolved (window_for) and >= 1. The destructor interrupts the
  // inner source before it joins the threads, so a slow inner fetch (a request with a long
  // timeout) ends at once, and resumes it after.
  LookaheadSource(std::shared_ptr<SampleSource> inner, std::shared_ptr<const TokenDataset> dataset,
                  const LookaheadOptions& options);
  ~LookaheadSource() override;
  LookaheadSource(const LookaheadSource&) = delete;
  LookaheadSource& operator=(const LookaheadSource&) = delete;

  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;
  // A claim waits for the inner source's fetch: as many may block as there.
  int blocking_fetches() const override { return inner_->blocking_fetches(); }
  bool cancelled_fetches_leave_data() const override {
    return inner_->cancelled_fetches_leave_data();
  }

  // Replaces `stream`'s plan: `batches` (global rows, in delivery order) and `next`, the plan that
  // follows (started once no row of the active plan waits). `budget_bytes` > 0 sets the budget
  // from then on (the loader's: byte_budget.h; before any, read_ahead_budget_bytes(0, 0)).
  // Out-of-range rows are refused with kInvalidArgument.
  void plan(int stream, const std::vector<std::vector<std::int64_t>>& batches,
            const std::vector<std::vector<std::int64_t>>& next = {},
            std::uint64_t budget_bytes = 0);
  // Stream 0's plan, each row its own batch.
  void plan_rows(const std::vector<std::int64_t>& rows);
  // A loader's epoch (SampleSource): plan(stream, batches, next, the plan's budget_bytes).
  void will_need(const ReadAheadPlan& plan) override;
  bool plans_next_epoch() const override { return options_.next_epoch; }
  void forget_plan(int stream) override {
    clear(stream);
    inner_->forget_plan(stream);
  }
  bool stored_locally(std::int64_t global_row) const override {
    return inner_->stored_locally(global_row);
  }
  // Its own, with the inner source's (a file read-ahead under it).
  ReadAheadMemory read_ahead_memory() const override;
  const LookaheadOptions& options() const { return options_; }
  // Forgets `stream`'s plan (its unclaimed samples are dropped unless another plan holds them).
  void clear(int stream);
  // Forgets every plan and drops every unclaimed sample; rows under way finish and are dropped.
  void clear();

  // The pipeline's stop mid-epoch: clear() and interrupt the inner source (rows under way end at
  // once); resume() waits for the lookahead threads to be idle, then resumes the inner source.
  void interrupt() override;
  void resume() override;

  LookaheadStats stats() const;
  // The inner source's report with {"lookahead": stats()} added.
  StatsTree stats_report() const override;
  // Whether the lookahead has started all it may until the next claim or plan: no fetch under way,
  // and no row that the window and the budget let it start (nor a claimed one). What a caller
  // waits for before it checks that the window held (a sleep would not say whether the threads
  // got there).
  bool settled() const;

 private:
  struct Entry {
    FetchSchedule::Item item;
    bool done = false;
    FetchOutcome outcome;
    std::uint64_t bytes = 0;  // counted in held_: the estimate, then the sample's own
    bool orphan = false;      // under way, wanted by no plan any more: dropped when it ends
    std::chrono::steady_clock::time_point started;
    int attempts = 0;      // fetches under way: 1, or 2 once hedged
    bool hedged = false;   // a second fetch was started (at most one per entry)
    bool decided = false;  // a fetch's outcome is the entry's (done unless orphaned)
    std::array<std::atomic<bool>, 2> cancel{};  // per fetch: [0] the first, [1] the hedge
  };
  void run();
  // Runs fetch `attempt` (0 the first, 1 the hedge) of `entry` with the lock released, then settles
  // the entry with the lock held again.
  void run_attempt(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Entry>& entry,
                   int attempt, bool not_stored);
  // The running entry most overdue for a hedge, if any; else `next_due` is lowered to the next
  // time one may become due.
  // Hedges have won more often than they lost (see the header).
  bool hedges_pay() const { return stats_.memory.hedges_won > stats_.memory.hedges_lost; }
  std::shared_ptr<Entry> hedge_candidate(std::chrono::steady_clock::time_point now,
                                         std::chrono::steady_clock::time_point& next_due) const;
  bool fits(std::int64_t tokens) const;
  // Keeps the samples some plan still wants (marking their occurrences started), drops the rest.
  void reconcile(int stream);
  void drop(const std::shared_ptr<Entry>& entry);
  void hold(std::uint64_t bytes);
  void release(const std::shared_ptr<Entry>& entry);
  void observe(const FetchSchedule::Item& item, double seconds);

  const std::shared_ptr<SampleSource> inner_;
  const std::shared_ptr<const TokenDataset> dataset_;
  const LookaheadOptions options_;
  const int window_;

  mutable std::mutex mutex_;
  std::condition_variable work_;     // a row may start (plan, room in the window), or stop
  std::condition_variable results_;  // an entry finished (or a thread went idle)
  ServiceTimeModel model_;
  FetchSchedule schedule_;
  std::int64_t completions_since_rekey_ = 0;
  // Entries started for each row, in start order; a claim takes the first.
  std::unordered_map<std::int64_t, std::deque<std::shared_ptr<Entry>>> entries_;
  // Queued rows a claim found not stored (fetch_stored): their thread calls fetch_not_stored.
  std::unordered_set<std::int64_t> not_stored_;
  // Entries with a fetch under way (orphans included), for hedging.
  std::vector<std::shared_ptr<Entry>> running_entries_;
  int hedges_running_ = 0;
  std::int64_t held_rows_ = 0;         // entries not claimed and not orphaned
  ByteBudget held_;                    // see the header's formula
  std::uint64_t bytes_per_token_ = 0;  // the largest seen
  bool stopping_ = false;
  LookaheadStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace draftfeed
