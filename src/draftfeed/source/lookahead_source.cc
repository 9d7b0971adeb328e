#include "draftfeed/source/lookahead_source.h"

#include <algorithm>
#include <exception>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

LookaheadSource::LookaheadSource(std::shared_ptr<SampleSource> inner,
                                 std::shared_ptr<const TokenDataset> dataset, int window)
    : inner_(std::move(inner)), dataset_(std::move(dataset)), window_(window) {
  require(inner_ != nullptr && dataset_ != nullptr, ErrorKind::kInvalidArgument,
          "the lookahead needs a source and a dataset");
  require(window >= 1, ErrorKind::kInvalidArgument,
          "the lookahead needs window >= 1, got " + std::to_string(window));
  const int threads = std::max(1, inner_->blocking_fetches());
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { run(); });
}

LookaheadSource::~LookaheadSource() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_.notify_all();
  inner_->interrupt();
  for (auto& t : threads_) t.join();
  inner_->resume();  // the inner source may outlive the lookahead
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

void LookaheadSource::run() {
  while (true) {
    std::unique_lock lock(mutex_);
    work_.wait(lock, [this] {
      return stopping_ || (!queue_.empty() && static_cast<int>(entries_.size()) < window_);
    });
    if (stopping_) return;
    const std::int64_t row = queue_.front();
    queue_.pop_front();
    if (entries_.count(row) != 0) continue;  // listed twice: the first one serves both
    auto entry = std::make_shared<Entry>();
    entries_[row] = entry;
    const std::uint64_t generation = generation_;
    ++stats_.running;
    lock.unlock();

    FetchOutcome outcome;
    try {
      outcome = inner_->fetch(row, dataset_->input_ids(row));
    } catch (const std::exception& error) {
      // The pipeline treats a throwing source as fatal; carry that to the claiming fetch().
      outcome = FetchOutcome::dropped(DropReason::kInvalid, error.what(), true);
    }

    lock.lock();
    --stats_.running;
    entry->outcome = std::move(outcome);
    entry->done = true;
    if (generation != generation_) ++stats_.discarded;  // replaced meanwhile: nobody will claim
    lock.unlock();
    results_.notify_all();
  }
}

FetchOutcome LookaheadSource::fetch(std::int64_t row, const IntArrayView& input_ids) {
  std::unique_lock lock(mutex_);
  const auto it = entries_.find(row);
  if (it != entries_.end()) {
    const std::shared_ptr<Entry> entry = it->second;
    ++stats_.hits;
    results_.wait(lock, [&entry] { return entry->done; });
    const auto again = entries_.find(row);
    if (again != entries_.end() && again->second == entry) entries_.erase(again);
    FetchOutcome outcome = std::move(entry->outcome);
    lock.unlock();
    work_.notify_all();  // room in the window
    return outcome;
  }
  const auto queued = std::find(queue_.begin(), queue_.end(), row);
  if (queued != queue_.end()) queue_.erase(queued);
  ++stats_.inline_fetches;
  lock.unlock();
  return inner_->fetch(row, input_ids);
}

void LookaheadSource::prefetch(std::vector<std::int64_t> rows) {
  const std::int64_t n_rows = dataset_->num_rows();
  for (const std::int64_t row : rows) {
    require(row >= 0 && row < n_rows, ErrorKind::kInvalidArgument,
            "prefetch: row " + std::to_string(row) + " is outside the dataset's " +
                std::to_string(n_rows) + " rows");
  }
  {
    std::lock_guard lock(mutex_);
    ++generation_;
    for (const auto& [row, entry] : entries_) {
      if (entry->done) ++stats_.discarded;
    }
    entries_.clear();
    queue_.assign(rows.begin(), rows.end());
  }
  work_.notify_all();
}

void LookaheadSource::clear() { prefetch({}); }

LookaheadStats LookaheadSource::stats() const {
  std::lock_guard lock(mutex_);
  LookaheadStats out = stats_;
  out.queued = static_cast<std::int64_t>(queue_.size());
  out.ready = 0;
  for (const auto& [row, entry] : entries_) out.ready += entry->done ? 1 : 0;
  return out;
}

}  // namespace draftfeed
