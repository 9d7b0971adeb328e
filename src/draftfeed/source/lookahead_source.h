// A fetch lookahead: a SampleSource that fetches the rows it was told are coming, in that order,
// ahead of the pipeline's requests, with its own threads.
//
// Why: the pipeline takes a batch buffer before fetching a batch's samples, so with in-order
// delivery a batch stuck on one slow request holds every buffer behind it and the requests in
// flight dry up (head-of-line blocking). A fetched sample costs no buffer (it is a mapped file),
// so fetching ahead of the buffers keeps the inner source's requests in flight while the buffers
// wait: the lookahead runs one thread per fetch the inner source may keep blocked
// (SampleSource::blocking_fetches, at least one).
//
// `prefetch(rows)` replaces the queue (e.g. the epoch's rows in plan order). Worker threads take
// rows from its front and call the inner source; at most `window` rows are fetched but not yet
// claimed at once. `fetch(row)` takes the row's result (waiting if it is under way), or fetches it
// inline when it was not started (a queued row is taken out of the queue first). Rows that are
// never claimed are dropped at the next prefetch() or at destruction (their outcomes only hold
// mappings: the inner source already cached or deleted their files).
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

struct LookaheadStats {
  std::int64_t queued = 0;          // rows waiting in the queue
  std::int64_t running = 0;         // rows being fetched by the lookahead threads
  std::int64_t ready = 0;           // rows fetched, not yet claimed
  std::int64_t hits = 0;            // fetch() calls served by the lookahead (ready or under way)
  std::int64_t inline_fetches = 0;  // fetch() calls the lookahead had not started
  std::int64_t discarded = 0;       // fetched rows never claimed (replaced or destroyed)
};

class LookaheadSource : public SampleSource {
 public:
  // `window` >= 1 rows fetched ahead at most. The destructor interrupts the inner source before
  // it joins the threads, so a slow inner fetch (a request with a long timeout) ends at once, and
  // resumes it after.
  LookaheadSource(std::shared_ptr<SampleSource> inner, std::shared_ptr<const TokenDataset> dataset,
                  int window);
  ~LookaheadSource() override;
  LookaheadSource(const LookaheadSource&) = delete;
  LookaheadSource& operator=(const LookaheadSource&) = delete;

  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;
  // A claim waits for the inner source's fetch: as many may block as there.
  int blocking_fetches() const override { return inner_->blocking_fetches(); }

  // The rows coming next, in order (global rows; out-of-range ones are refused with
  // kInvalidArgument). Replaces the previous queue and drops unclaimed results.
  void prefetch(std::vector<std::int64_t> rows);
  // Empties the queue and drops unclaimed results; rows under way finish and are dropped.
  void clear();

  // The pipeline's stop: clear() and interrupt the inner source (rows under way end at once);
  // resume() waits for the lookahead threads to be idle, then resumes the inner source.
  void interrupt() override;
  void resume() override;

  LookaheadStats stats() const;

 private:
  struct Entry {
    bool done = false;
    FetchOutcome outcome;
  };
  void run();

  const std::shared_ptr<SampleSource> inner_;
  const std::shared_ptr<const TokenDataset> dataset_;
  const int window_;

  mutable std::mutex mutex_;
  std::condition_variable work_;     // queue non-empty with room in the window, or stopping
  std::condition_variable results_;  // an entry finished (or a thread went idle)
  std::deque<std::int64_t> queue_;
  std::unordered_map<std::int64_t, std::shared_ptr<Entry>> entries_;  // started, unclaimed
  std::uint64_t generation_ = 0;  // bumped by prefetch()/clear(): late results are dropped
  bool stopping_ = false;
  LookaheadStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace draftfeed
