// The interface between the sample sources (a cache, online generation, a transfer object, a
// lookahead over any of them) and the pipeline: the pipeline asks a source for a global row and
// gets a `FetchOutcome` (sample/fetched_sample.h), and tells it the epoch's plan
// (sample/read_ahead_plan.h) so that it can read ahead.
#pragma once

#include <cstdint>
#include <optional>

#include "draftfeed/common/stats_tree.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/read_ahead/byte_budget.h"
#include "draftfeed/sample/fetched_sample.h"
#include "draftfeed/sample/read_ahead_plan.h"

namespace draftfeed {

// Fetches the hidden states of rows. Called concurrently from the pipeline's threads.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // `input_ids` is the dataset row (for the token check). Must not throw for a bad sample (return a
  // drop); may throw for a failure that ends the run.
  virtual FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) = 0;

  // The row from what is already stored (a cache file, a transfer's store), without generating
  // it: nullopt when it is not there. A lookahead serves a waiting consumer this way rather than
  // queueing the row behind requests that may block for long. The default: nothing is stored.
  virtual std::optional<FetchOutcome> fetch_stored(std::int64_t /*global_row*/,
                                                   const IntArrayView& /*input_ids*/) {
    return std::nullopt;
  }
  // fetch() of a row fetch_stored() just found not stored: a source skips the second lookup (a
  // custom transfer's get_cached is called once per row, as the reference calls it).
  virtual FetchOutcome fetch_not_stored(std::int64_t global_row, const IntArrayView& input_ids) {
    return fetch(global_row, input_ids);
  }

  // The epoch's plan (sample/read_ahead_plan.h): a source whose reads can start early (cache files
  // opened and read ahead, requests started ahead) starts them, at its own pace and within its own
  // budgets, however far ahead of the batch buffers. Must be cheap and must not block. Called from
  // the loader's thread, concurrently with fetch().
  virtual void will_need(const ReadAheadPlan& /*plan*/) {}
  // Whether will_need wants the next epoch's batches too (ReadAheadPlan::next).
  virtual bool plans_next_epoch() const { return false; }
  // The loader of `stream` is gone: what was read ahead for it alone may go.
  virtual void forget_plan(int /*stream*/) {}
  // Whether the row is stored where a fetch reads it without asking a server, known without a
  // file system call (a packed row: an index lookup). A request lookahead leaves such rows to the
  // claim, its threads for the rows the servers must generate. Called concurrently with fetch().
  virtual bool stored_locally(std::int64_t /*global_row*/) const { return false; }

  // Stopping mid-epoch: the pipeline calls interrupt() so that fetches that may block for long (a
  // request with a two-minute timeout) end now, and resume() once its threads have joined, before
  // the next epoch. Fetches that end because of interrupt() are not failures of the sample.
  virtual void interrupt() {}
  virtual void resume() {}

  // What the source has to report, as named groups (a cache's "read_ahead", an online source's
  // counts and its "lookahead"): the loader's metrics carry them without knowing the source.
  virtual StatsTree stats_report() const { return {}; }
  // What the source's read-ahead holds ahead of the loader, against the plan's budget
  // (read_ahead/byte_budget.h), and its hedges: the file read-ahead's, the lookahead's, or both
  // summed where one source holds another. The loader reports it once ("read_ahead_memory").
  virtual ReadAheadMemory read_ahead_memory() const { return {}; }

  // How many fetches this source may keep blocked at once for a long time (a request to a server
  // holds its fetch for the whole round trip). The pipeline runs that many threads on top of its
  // own, so blocked fetches never hold back the copies; 0 (the default) for sources whose fetches
  // are short (a file read).
  virtual int blocking_fetches() const { return 0; }

  // Whether a fetch cancelled before its answer came leaves data behind that this source cannot
  // find again (a transfer's store, keyed by what the server answers): a hedged fetch's loser is
  // then let run to its end (its data removed as any fetch's) instead of being cancelled.
  virtual bool cancelled_fetches_leave_data() const { return false; }
};

}  // namespace draftfeed
