#include "draftfeed/source/lookahead_source.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

// What a sample holds: its hidden states (and an FP8 file's scales).
std::uint64_t sample_bytes(const FetchedSample& sample) {
  const HiddenStatesView& hs = sample.hidden;
  auto bytes = static_cast<std::uint64_t>(hs.tokens * hs.layers * hs.hidden) *
               dtype_size(hs.dtype);
  if (hs.scales != nullptr) bytes += static_cast<std::uint64_t>(hs.tokens) * 4;
  return bytes;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

LookaheadSource::LookaheadSource(std::shared_ptr<SampleSource> inner,
                                 std::shared_ptr<const TokenDataset> dataset,
                                 std::uint64_t budget_bytes)
    : inner_(std::move(inner)),
      dataset_(std::move(dataset)),
      slots_(std::max(1, inner_ ? inner_->blocking_fetches() : 1)),
      budget_bytes_(budget_bytes),
      schedule_(slots_) {
  require(inner_ != nullptr && dataset_ != nullptr, ErrorKind::kInvalidArgument,
          "the lookahead needs a source and a dataset");
  for (int t = 0; t < slots_; ++t) threads_.emplace_back([this] { run(); });
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

std::uint64_t LookaheadSource::budget() const {
  if (budget_bytes_ > 0) return budget_bytes_;
  return plan_budget_ > 0 ? plan_budget_ : kDefaultBudgetBytes;
}

bool LookaheadSource::fits(std::int64_t tokens) const {
  return held_bytes_ + static_cast<std::uint64_t>(tokens) * bytes_per_token_ <= budget();
}

void LookaheadSource::hold(std::uint64_t bytes) {
  held_bytes_ += bytes;
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held_bytes_);
}

void LookaheadSource::run() {
  while (true) {
    std::unique_lock lock(mutex_);
    std::optional<FetchSchedule::Item> item;
    work_.wait(lock, [&] {
      if (stopping_) return true;
      if (fatal_ || inner_interrupted_) return false;
      item = schedule_.pick([this](std::int64_t tokens) { return fits(tokens); });
      return item.has_value();
    });
    if (stopping_) return;
    auto entry = std::make_shared<Entry>();
    entry->item = *item;
    entry->bytes = static_cast<std::uint64_t>(item->tokens) * bytes_per_token_;
    entry->inner_interrupts = inner_interrupts_;
    entries_[item->row].push_back(entry);
    hold(entry->bytes);
    ++stats_.running;
    if (item->next) ++stats_.next_plan_started;
    lock.unlock();
    results_.notify_all();  // a claim waiting for this row to start

    FetchOutcome outcome;
    const auto start = std::chrono::steady_clock::now();
    try {
      outcome = inner_->fetch(item->row, dataset_->input_ids(item->row));
    } catch (const std::exception& error) {
      // The pipeline treats a throwing source as fatal; carry that to the claiming fetch().
      outcome = FetchOutcome::dropped(DropReason::kInvalid, error.what(), true);
    }
    const double seconds = seconds_since(start);

    lock.lock();
    --stats_.running;
    const bool cut_short = !outcome.sample && entry->inner_interrupts != inner_interrupts_;
    if (cut_short || entry->orphan) {
      // Ended by an interrupt of the inner source (not the row's failure: fetched again), or
      // wanted by no plan any more.
      held_bytes_ -= entry->bytes;
      auto& list = entries_[item->row];
      list.erase(std::remove(list.begin(), list.end(), entry), list.end());
      if (list.empty()) entries_.erase(item->row);
      if (cut_short && !entry->orphan) {
        schedule_.requeue(entry->item);
        ++stats_.requeued;
      } else {
        ++stats_.discarded;
      }
    } else {
      if (outcome.sample) {
        model_.observe(item->row, item->tokens, seconds);
        const std::uint64_t bytes = sample_bytes(*outcome.sample);
        if (item->tokens > 0) {
          bytes_per_token_ =
              std::max(bytes_per_token_, bytes / static_cast<std::uint64_t>(item->tokens));
        }
        held_bytes_ -= entry->bytes;
        entry->bytes = bytes;
        hold(bytes);
        // New observations move predictions: the keys follow, in batches (a re-key sorts the
        // whole queue).
        const std::int64_t every = std::max<std::int64_t>(slots_, schedule_.queued() / 8);
        if (++completions_since_rekey_ >= every) {
          schedule_.rekey(model_);
          completions_since_rekey_ = 0;
        }
      } else {
        held_bytes_ -= entry->bytes;  // a failure holds nothing
        entry->bytes = 0;
      }
      if (outcome.fatal) fatal_ = true;
      entry->outcome = std::move(outcome);
      entry->done = true;
    }
    lock.unlock();
    results_.notify_all();
    work_.notify_all();
  }
}

FetchOutcome LookaheadSource::take(std::deque<std::shared_ptr<Entry>>& list,
                                   std::unique_lock<std::mutex>& lock, std::int64_t row) {
  const std::shared_ptr<Entry> entry = list.front();
  results_.wait(lock, [&] { return entry->done || interrupted_ || stopping_; });
  if (!entry->done) {
    return FetchOutcome::dropped(DropReason::kGenerationFailed,
                                 "row " + std::to_string(row) + ": the loader stopped");
  }
  // The entry may have moved in its row's list meanwhile (entries before it were dropped).
  auto found = entries_.find(row);
  if (found != entries_.end()) {
    auto& current = found->second;
    current.erase(std::remove(current.begin(), current.end(), entry), current.end());
    if (current.empty()) entries_.erase(found);
  }
  held_bytes_ -= entry->bytes;
  ++stats_.hits;
  FetchOutcome outcome = std::move(entry->outcome);
  lock.unlock();
  work_.notify_all();  // room in the budget
  return outcome;
}

FetchOutcome LookaheadSource::fetch(std::int64_t row, const IntArrayView& input_ids) {
  std::unique_lock lock(mutex_);
  bool waited = false;
  while (true) {
    if (interrupted_ || stopping_) {
      return FetchOutcome::dropped(DropReason::kGenerationFailed,
                                   "row " + std::to_string(row) + ": the loader stopped");
    }
    const auto found = entries_.find(row);
    if (found != entries_.end() && !found->second.empty()) {
      if (waited) ++stats_.claims_waited;
      return take(found->second, lock, row);
    }
    if (fatal_ || !schedule_.claim(row)) break;
    // Queued: claimed, so the next free thread starts it whatever the budget.
    waited = true;
    work_.notify_one();
    results_.wait(lock, [&] {
      const auto again = entries_.find(row);
      return interrupted_ || stopping_ || fatal_ ||
             (again != entries_.end() && !again->second.empty());
    });
  }
  ++stats_.inline_fetches;
  ++inline_running_;
  lock.unlock();
  FetchOutcome outcome;
  try {
    outcome = inner_->fetch(row, input_ids);
  } catch (...) {
    lock.lock();
    --inline_running_;
    lock.unlock();
    results_.notify_all();
    throw;
  }
  lock.lock();
  --inline_running_;
  lock.unlock();
  results_.notify_all();
  return outcome;
}

void LookaheadSource::drop(const std::shared_ptr<Entry>& entry) {
  if (entry->done) {
    held_bytes_ -= entry->bytes;
    if (entry->outcome.sample) ++stats_.discarded;
  } else {
    entry->orphan = true;  // its thread drops it (and its bytes) when it ends
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
  auto with_tokens = [&](const std::vector<std::vector<std::int64_t>>& plan) {
    FetchSchedule::Batches out(plan.size());
    for (std::size_t b = 0; b < plan.size(); ++b) {
      for (const std::int64_t row : plan[b]) {
        require(row >= 0 && row < n_rows, ErrorKind::kInvalidArgument,
                "lookahead plan: row " + std::to_string(row) + " is outside the dataset's " +
                    std::to_string(n_rows) + " rows");
        out[b].push_back({row, dataset_->input_ids(row).size()});
      }
    }
    return out;
  };
  const FetchSchedule::Batches current = with_tokens(batches);
  const FetchSchedule::Batches after = with_tokens(next);
  {
    std::lock_guard lock(mutex_);
    if (budget_bytes > 0) plan_budget_ = budget_bytes;
    stats_.budget_bytes = budget();
    schedule_.set_plan(stream, current, after, model_);
    reconcile(stream);
  }
  work_.notify_all();
}

void LookaheadSource::prefetch(const std::vector<std::int64_t>& rows) {
  std::vector<std::vector<std::int64_t>> batches;
  batches.reserve(rows.size());
  for (const std::int64_t row : rows) batches.push_back({row});
  plan(0, batches);
}

void LookaheadSource::clear(int stream) {
  {
    std::lock_guard lock(mutex_);
    schedule_.drop_stream(stream);
    reconcile(stream);
  }
  work_.notify_all();
}

void LookaheadSource::clear() {
  {
    std::lock_guard lock(mutex_);
    const std::vector<int> streams = schedule_.streams();
    for (const int stream : streams) schedule_.drop_stream(stream);
    reconcile(-1);
  }
  work_.notify_all();
}

void LookaheadSource::interrupt() {
  bool cancel = false;
  {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
    if (inline_running_ > 0) {
      // An inline fetch may block for long (a request with a long timeout): only the inner
      // source can end it, and that ends the lookahead's own fetches too (put back, see run()).
      cancel = true;
      inner_interrupted_ = true;
      ++inner_interrupts_;
    }
  }
  results_.notify_all();
  if (cancel) inner_->interrupt();
}

void LookaheadSource::resume() {
  bool resume_inner = false;
  {
    // Fetches under way end promptly once the inner source is interrupted; resuming it before
    // they do would let them run to completion for nothing.
    std::unique_lock lock(mutex_);
    if (inner_interrupted_) {
      results_.wait(lock, [this] { return stats_.running == 0 && inline_running_ == 0; });
      resume_inner = true;
    }
  }
  if (resume_inner) inner_->resume();
  {
    std::lock_guard lock(mutex_);
    interrupted_ = false;
    inner_interrupted_ = false;
  }
  work_.notify_all();
}

LookaheadStats LookaheadSource::stats() const {
  std::lock_guard lock(mutex_);
  LookaheadStats out = stats_;
  out.queued = schedule_.queued();
  out.ready = 0;
  for (const auto& [row, list] : entries_) {
    for (const auto& entry : list) out.ready += entry->done ? 1 : 0;
  }
  out.held_bytes = held_bytes_;
  out.budget_bytes = budget();
  out.trusts_history = model_.trusts_history();
  return out;
}

}  // namespace draftfeed
