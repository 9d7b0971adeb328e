#include "draftfeed/source/lookahead_source.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <string>

#include "draftfeed/common/cancel_scope.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

// What a sample holds: its hidden states (and an FP8 file's scales).
std::uint64_t sample_bytes(const FetchedSample& sample) {
  const HiddenStatesView& hs = sample.hidden;
  auto bytes = static_cast<std::uint64_t>(hs.tokens * hs.layers * hs.hidden) * dtype_size(hs.dtype);
  if (hs.scales != nullptr) bytes += static_cast<std::uint64_t>(hs.tokens) * 4;
  return bytes;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void LookaheadOptions::validate() const {
  require(!window || *window >= 0, ErrorKind::kInvalidArgument,
          "lookahead must be >= 0 (0: off), got " + std::to_string(window.value_or(0)));
  hedge.validate("hedge_factor", "hedge_min_seconds");
}

int LookaheadOptions::window_for(int blocking_fetches, bool has_dataset) const {
  if (window) return *window;
  return has_dataset ? kRowsPerFetch * std::max(1, blocking_fetches) : 0;
}

LookaheadSource::LookaheadSource(std::shared_ptr<SampleSource> inner,
                                 std::shared_ptr<const TokenDataset> dataset,
                                 const LookaheadOptions& options)
    : inner_(std::move(inner)),
      dataset_(std::move(dataset)),
      options_(options),
      window_(options_.window.value_or(0)),
      schedule_(std::max(1, inner_ ? inner_->blocking_fetches() : 1)) {
  held_.set_limit(read_ahead_budget_bytes(0, 0));
  require(inner_ != nullptr && dataset_ != nullptr, ErrorKind::kInvalidArgument,
          "the lookahead needs a source and a dataset");
  options_.validate();
  require(window_ >= 1, ErrorKind::kInvalidArgument,
          "the lookahead needs window >= 1, got " + std::to_string(window_));
  const int threads = std::max(1, inner_->blocking_fetches());
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { run(); });
}

LookaheadSource::~LookaheadSource() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  results_.notify_all();
  inner_->interrupt();
  for (auto& t : threads_) t.join();
  inner_->resume();  // the inner source may outlive the lookahead
}

bool LookaheadSource::fits(std::int64_t tokens) const {
  return held_rows_ < window_ && held_.fits(static_cast<std::uint64_t>(tokens) * bytes_per_token_);
}

void LookaheadSource::hold(std::uint64_t bytes) { held_.hold(bytes); }

void LookaheadSource::release(const std::shared_ptr<Entry>& entry) {
  held_.release(entry->bytes);
  entry->bytes = 0;
  --held_rows_;
}

void LookaheadSource::observe(const FetchSchedule::Item& item, double seconds) {
  model_.observe(item.row, item.tokens, seconds);
  // New observations move predictions: the keys follow, in batches (a re-key sorts the whole
  // queue).
  const std::int64_t every = std::max<std::int64_t>(1, schedule_.queued() / 64);
  if (++completions_since_rekey_ >= every) {
    schedule_.rekey(model_);
    completions_since_rekey_ = 0;
  }
}

std::shared_ptr<LookaheadSource::Entry> LookaheadSource::hedge_candidate(
    std::chrono::steady_clock::time_point now,
    std::chrono::steady_clock::time_point& next_due) const {
  if (!options_.hedge.enabled() || model_.observations() < kMinHedgeObservations) return nullptr;
  std::shared_ptr<Entry> best;
  std::chrono::steady_clock::time_point best_due;
  for (const auto& entry : running_entries_) {
    if (entry->orphan || entry->decided || entry->hedged) continue;
    const double predicted = model_.predict(entry->item.row, entry->item.tokens);
    const double after = options_.hedge.delay(std::chrono::duration<double>(predicted)).count();
    const auto due =
        entry->started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(after));
    if (due > now) {
      next_due = std::min(next_due, due);
    } else if (!best || due < best_due) {
      best = entry;
      best_due = due;
    }
  }
  return best;
}

void LookaheadSource::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    std::optional<FetchSchedule::Item> item;
    std::shared_ptr<Entry> hedge;
    while (!stopping_) {
      // A due hedge goes before new rows once hedges have paid (see hedges_pay()): the row it
      // serves was due long ago, and its answer ends the slow request, freeing its slot.
      const auto now = std::chrono::steady_clock::now();
      auto next_due = std::chrono::steady_clock::time_point::max();
      hedge = hedge_candidate(now, next_due);
      if (hedge && hedges_pay()) break;
      item = schedule_.pick([this](std::int64_t tokens) { return fits(tokens); });
      if (item) {
        hedge = nullptr;  // the row goes first
        break;
      }
      // Nothing else to start: an idle thread hedges, one at a time until hedges pay, and not
      // once they clearly do not (the slow requests are slow for the prompt's sake).
      if (hedge && hedges_running_ == 0 && stats_.memory.hedges_lost < stats_.memory.hedges_won + 2)
        break;
      hedge = nullptr;
      if (next_due == std::chrono::steady_clock::time_point::max()) {
        work_.wait(lock);
      } else {
        work_.wait_until(lock, next_due);
      }
    }
    if (stopping_) return;
    if (hedge) {
      hedge->hedged = true;
      ++stats_.memory.hedges;
      ++hedges_running_;
      run_attempt(lock, hedge, 1, true);
      --hedges_running_;
      continue;
    }
    const bool not_stored = not_stored_.erase(item->row) > 0;
    auto entry = std::make_shared<Entry>();
    entry->item = *item;
    entry->bytes = static_cast<std::uint64_t>(item->tokens) * bytes_per_token_;
    entries_[item->row].push_back(entry);
    ++held_rows_;
    hold(entry->bytes);
    if (item->next) ++stats_.next_plan_started;
    entry->started = std::chrono::steady_clock::now();
    running_entries_.push_back(entry);
    run_attempt(lock, entry, 0, not_stored);
  }
}

void LookaheadSource::run_attempt(std::unique_lock<std::mutex>& lock,
                                  const std::shared_ptr<Entry>& entry, int attempt,
                                  bool not_stored) {
  const FetchSchedule::Item item = entry->item;
  ++entry->attempts;
  ++stats_.running;
  lock.unlock();
  results_.notify_all();  // a claim waiting for this row to start
  work_.notify_all();     // a thread waiting to hedge: the deadline of a new fetch

  FetchOutcome outcome;
  const auto start = std::chrono::steady_clock::now();
  {
    const CancelScope scope(&entry->cancel[static_cast<std::size_t>(attempt)]);
    try {
      // A hedge asks for the sample anew: the first fetch already looked in the store.
      outcome = not_stored ? inner_->fetch_not_stored(item.row, dataset_->input_ids(item.row))
                           : inner_->fetch(item.row, dataset_->input_ids(item.row));
    } catch (const std::exception& error) {
      // The pipeline treats a throwing source as fatal; carry that to the claiming fetch().
      outcome = FetchOutcome::dropped(DropReason::kInvalid, error.what(), true);
    }
  }
  const double seconds = seconds_since(start);

  lock.lock();
  --stats_.running;
  --entry->attempts;
  // This fetch decides the entry unless the other one did, or this one failed (not fatally) while
  // the other may still bring the sample.
  const bool decides = !entry->decided && (outcome.sample || outcome.fatal || entry->attempts == 0);
  if (decides) {
    entry->decided = true;
    // The other fetch, if any, lost: its request ends, unless ending it would leave its sample
    // where nothing finds it again (a Mooncake key named only in the answer): then it runs on and
    // its sample is discarded (and removed by the source) when it comes.
    if (entry->attempts > 0 && !inner_->cancelled_fetches_leave_data()) {
      entry->cancel[static_cast<std::size_t>(1 - attempt)] = true;
    }
    if (outcome.sample && entry->hedged)
      ++(attempt == 1 ? stats_.memory.hedges_won : stats_.memory.hedges_lost);
    if (outcome.sample) {
      observe(item, seconds);
      if (item.tokens > 0) {
        bytes_per_token_ = std::max(bytes_per_token_, sample_bytes(*outcome.sample) /
                                                          static_cast<std::uint64_t>(item.tokens));
      }
    }
    if (entry->orphan) {
      // Wanted by no plan any more (replaced, cleared or interrupted meanwhile): its bytes and row
      // were released when it was orphaned.
      if (outcome.sample) ++stats_.discarded;
    } else {
      held_.release(entry->bytes);
      entry->bytes = outcome.sample ? sample_bytes(*outcome.sample) : 0;  // a failure holds none
      hold(entry->bytes);
      entry->outcome = std::move(outcome);
      entry->done = true;
    }
  }
  if (entry->attempts == 0) std::erase(running_entries_, entry);
  lock.unlock();
  results_.notify_all();
  work_.notify_all();
  lock.lock();
}

FetchOutcome LookaheadSource::fetch(std::int64_t row, const IntArrayView& input_ids) {
  std::unique_lock lock(mutex_);
  bool looked_in_store = false;
  while (!stopping_) {
    const auto found = entries_.find(row);
    if (found != entries_.end() && !found->second.empty()) {
      const std::shared_ptr<Entry> entry = found->second.front();
      found->second.pop_front();
      if (found->second.empty()) entries_.erase(found);
      ++stats_.hits;
      // Claimed: no plan may drop it now; its bytes and row leave the lookahead's count.
      release(entry);
      ++stats_.waiting_claims;
      results_.wait(lock, [&] { return entry->done || stopping_; });
      --stats_.waiting_claims;
      if (!entry->done) break;
      held_.release(entry->bytes);  // the sample's own bytes, counted when it ended
      FetchOutcome outcome = std::move(entry->outcome);
      lock.unlock();
      work_.notify_all();  // room in the window
      return outcome;
    }
    std::optional<FetchSchedule::Item> taken;
    if (!looked_in_store) taken = schedule_.take_row(row);
    if (taken) {
      // Not started: if it is already stored (a cache file) it is read here, now, rather than
      // queued behind the lookahead's threads, whose fetches may all be held by slow requests.
      // Off the queue meanwhile, so that no thread starts it (and looks it up) too.
      looked_in_store = true;
      lock.unlock();
      std::optional<FetchOutcome> stored = inner_->fetch_stored(row, input_ids);
      lock.lock();
      if (stored) {
        ++stats_.stored_reads;
        return std::move(*stored);
      }
      schedule_.requeue(*taken);                           // unless a new plan dropped it meanwhile
      if (schedule_.queued(row)) not_stored_.insert(row);  // its thread does not look again
      continue;
    }
    if (!schedule_.claim(row)) {
      // No plan holds it (or no more): fetched here.
      ++stats_.inline_fetches;
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      FetchOutcome outcome = looked_in_store ? inner_->fetch_not_stored(row, input_ids)
                                             : inner_->fetch(row, input_ids);
      if (outcome.sample) {
        const double seconds = seconds_since(start);
        lock.lock();
        observe({row, static_cast<std::int64_t>(input_ids.size())}, seconds);
      }
      return outcome;
    }
    // Queued: claimed, so the next free lookahead thread starts it, ahead of the window and of the
    // rows not waited for (the consumer's plan order must not take the slots). A plan change or a
    // stop may take it off the queue instead: then it is fetched here.
    work_.notify_all();
    ++stats_.waiting_claims;
    results_.wait(lock, [&] {
      const auto again = entries_.find(row);
      return stopping_ || (again != entries_.end() && !again->second.empty()) ||
             !schedule_.queued(row);
    });
    --stats_.waiting_claims;
  }
  return FetchOutcome::dropped(DropReason::kGenerationFailed,
                               "row " + std::to_string(row) + ": the lookahead stopped");
}

void LookaheadSource::drop(const std::shared_ptr<Entry>& entry) {
  release(entry);
  if (entry->done) {
    if (entry->outcome.sample) ++stats_.discarded;
  } else {
    entry->orphan = true;  // its thread drops it when it ends
  }
}

void LookaheadSource::reconcile(int stream) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    const std::int64_t row = it->first;
    auto& list = it->second;
    // Failed outcomes are not kept: the row is fetched again.
    for (auto e = list.begin(); e != list.end();) {
      if ((*e)->done && !(*e)->outcome.sample) {
        drop(*e);
        e = list.erase(e);
      } else {
        ++e;
      }
    }
    // Keep as many as the plans have occurrences, those fetched first.
    const auto wanted = static_cast<std::size_t>(schedule_.occurrences(row));
    while (list.size() > wanted) {
      drop(list.back());
      list.pop_back();
    }
    // The samples kept serve this stream's new plan first.
    const auto mine = static_cast<std::size_t>(schedule_.occurrences(stream, row));
    for (std::size_t k = 0; k < std::min(list.size(), mine); ++k) schedule_.mark_started(row);
    it = list.empty() ? entries_.erase(it) : std::next(it);
  }
}

void LookaheadSource::plan(int stream, const std::vector<std::vector<std::int64_t>>& batches,
                           const std::vector<std::vector<std::int64_t>>& next,
                           std::uint64_t budget_bytes) {
  const std::int64_t n_rows = dataset_->num_rows();
  auto with_tokens = [&](const std::vector<std::vector<std::int64_t>>& plan, std::size_t limit) {
    FetchSchedule::Batches out;
    std::size_t rows = 0;
    for (std::size_t b = 0; b < plan.size() && rows < limit; ++b) {
      out.emplace_back();
      for (const std::int64_t row : plan[b]) {
        require(row >= 0 && row < n_rows, ErrorKind::kInvalidArgument,
                "lookahead plan: row " + std::to_string(row) + " is outside the dataset's " +
                    std::to_string(n_rows) + " rows");
        // Kept rows are read from disk by their claim, at the disk's pace: the threads and the
        // window are for the rows the servers generate, at theirs.
        if (inner_->stored_locally(row)) continue;
        out.back().push_back({row, static_cast<std::int64_t>(dataset_->input_ids(row).size())});
      }
      rows += plan[b].size();
    }
    return out;
  };
  const FetchSchedule::Batches current =
      with_tokens(batches, std::numeric_limits<std::size_t>::max());
  const FetchSchedule::Batches after = with_tokens(next, 2 * static_cast<std::size_t>(window_));
  {
    std::lock_guard lock(mutex_);
    if (budget_bytes > 0) held_.set_limit(budget_bytes);
    schedule_.set_plan(stream, current, after, model_);
    reconcile(stream);
    std::erase_if(not_stored_, [this](std::int64_t row) { return !schedule_.queued(row); });
  }
  work_.notify_all();
  results_.notify_all();  // claims of rows no plan holds any more
}

void LookaheadSource::plan_rows(const std::vector<std::int64_t>& rows) {
  std::vector<std::vector<std::int64_t>> batches;
  batches.reserve(rows.size());
  for (const std::int64_t row : rows) batches.push_back({row});
  plan(0, batches);
}

void LookaheadSource::will_need(const ReadAheadPlan& plan) {
  // The inner source's own epoch start first (an online source commits what it kept and looks at
  // its pack again), so that the plan below knows which rows are stored.
  inner_->will_need(plan);
  auto rows_of = [](const std::vector<PlannedBatch>& batches) {
    std::vector<std::vector<std::int64_t>> rows;
    rows.reserve(batches.size());
    for (const PlannedBatch& batch : batches) rows.push_back(batch.rows);
    return rows;
  };
  this->plan(plan.stream, rows_of(*plan.batches), rows_of(plan.next), plan.budget_bytes);
}

void LookaheadSource::clear(int stream) {
  {
    std::lock_guard lock(mutex_);
    schedule_.drop_stream(stream);
    reconcile(stream);
  }
  work_.notify_all();
  results_.notify_all();  // claims of rows no plan holds any more
}

void LookaheadSource::clear() {
  {
    std::lock_guard lock(mutex_);
    const std::vector<int> streams = schedule_.streams();
    for (const int stream : streams) schedule_.drop_stream(stream);
    reconcile(-1);
    not_stored_.clear();
  }
  work_.notify_all();
  results_.notify_all();  // claims of rows no plan holds any more
}

void LookaheadSource::interrupt() {
  clear();
  inner_->interrupt();
}

void LookaheadSource::resume() {
  {
    // Rows under way end promptly once the inner source is interrupted; resuming it before they
    // do would let them run to completion for nothing.
    std::unique_lock lock(mutex_);
    results_.wait(lock, [this] { return stats_.running == 0; });
  }
  inner_->resume();
}

ReadAheadMemory LookaheadSource::read_ahead_memory() const {
  ReadAheadMemory memory = stats().memory;
  memory += inner_->read_ahead_memory();
  return memory;
}

StatsTree LookaheadSource::stats_report() const {
  StatsTree out = inner_->stats_report();
  out.add_group("lookahead", stats_tree(stats()));
  return out;
}

bool LookaheadSource::settled() const {
  std::lock_guard lock(mutex_);
  // A thread picks its row and counts it running in one hold of the lock, and hedges only rows
  // under way: with none running and none to pick, no thread can start one.
  return stats_.running == 0 &&
         !schedule_.can_pick([this](std::int64_t tokens) { return fits(tokens); });
}

LookaheadStats LookaheadSource::stats() const {
  std::lock_guard lock(mutex_);
  LookaheadStats out = stats_;
  out.queued = schedule_.queued();
  out.ready = 0;
  for (const auto& [row, list] : entries_) {
    for (const auto& entry : list) out.ready += entry->done ? 1 : 0;
  }
  held_.report(out.memory);
  out.trusts_history = model_.trusts_history();
  out.tail_factor = model_.tail_factor();
  return out;
}

}  // namespace draftfeed
