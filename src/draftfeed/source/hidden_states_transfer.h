// A hidden-states transfer other than the shared file system: hs-connectors' interface
// (`setup`, `get_cached`, `get_generated`, `delete`, and an optional `cache`), for a Mooncake store
// or a custom object given from Python. The online source calls it instead of reading cache files
// and generated files itself; the native file path stays the default because it is faster.
//
// Thread safety: the online source calls these from its fetching threads concurrently; an
// implementation serialises what it must (the Python one holds the GIL per call).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "draftfeed/common/error.h"
#include "draftfeed/common/stats_tree.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

class HiddenStatesTransfer {
 public:
  virtual ~HiddenStatesTransfer() = default;

  // Once before the first generated sample (after the server answered, as the reference does).
  // Throws Error on failure; the round trip then counts as failed and setup is tried again later.
  virtual void setup() {}

  // The row's cached sample: ok, a kMissing drop when nothing is cached, or a drop naming the
  // problem (token ids that differ from the row: kMismatch). May throw only what the transfer
  // itself raised (the reference lets that end the run); the pipeline carries it to the consumer.
  virtual FetchOutcome get_cached(std::int64_t row, const IntArrayView& input_ids) = 0;

  // The generated sample named by the response's kv_transfer_params (JSON text), with its
  // token_ids equal to `ids` and hidden_states [T, L, H] for T = ids.size(). An error (naming the
  // handle and the reason) fails this round trip, which is then retried. Values are checked for
  // NaN/Inf by the caller.
  virtual Result<FetchedSample> get_generated(const std::string& transfer_params,
                                              const std::string& handle, std::int64_t row,
                                              std::span<const std::int64_t> ids) = 0;

  // on_generate = cache, after a valid load: keep the sample as the row's cache entry. Returns
  // false when the transfer cannot cache (the sample is then removed). Throws Error on failure.
  virtual bool cache(const std::string& handle, std::int64_t row) = 0;

  // Cleans up a generated sample (a loaded one with on_generate = delete, or a failed one).
  // Throws Error on failure (logged and counted, never fatal).
  virtual void remove(const std::string& handle) = 0;

  // How many loads may run beside `requests` requests in flight without holding a request slot:
  // the online source lets that many more fetches block, so a load overlaps the next request (a
  // transfer whose loads queue for a batched read: mooncake_transfer.h). 0: a load holds its
  // fetch's turn, as the reference's worker does.
  virtual int loads_beside_requests(int /*requests*/) const { return 0; }
  // The online source's cancel() and resume(): loads waiting for long end now (failed), later
  // ones fail at once until resume().
  virtual void cancel() {}
  virtual void resume() {}
  // What the transfer has to report (a group), carried in the online source's report.
  virtual StatsTree stats_report() const { return {}; }
};

}  // namespace draftfeed
