// The native Mooncake transfer: hs-connectors' `MooncakeTransfer` (its key and manifest format,
// mooncake_manifest.h), read in batches straight into registered memory.
//
// get_generated(manifest) parses the manifest, takes a region of the staging pool
// (staging_pool.h: memory registered with the store once) for the object, and queues the read.
// One reader thread serves every queued read and removal in rounds, the store client held once per
// round (mooncake_store.h: the GIL taken once for the whole batch of keys):
//   1. batch_remove of the removals queued (each key and its error marker, force);
//   2. batch_is_exist of the error markers of the reads due: a producer's error marker is read
//      (get) and fails its read, before the data, as hs-connectors prefers the marker;
//   3. batch_get_into of the other reads' objects, each into its region, its size the manifest's
//      total_aligned_bytes: a missing object is polled again (after 1 ms, doubling up to
//      `poll_interval`, as hs-connectors' get_sample polls) until `key_wait` has passed since the
//      read was queued; an object of another size fails (a smaller one reads short; a larger one is
//      refused by the store and its size asked for the message).
// The caller checks what it got as a file is checked (validate.h's rules): token_ids a 1-D integer
// tensor equal to the row's ids, hidden_states bf16/f16/f32 [T, L, H] with T the row's length; the
// online source then scans the values for NaN/Inf (no torch tensor, no Python object per tensor).
// The sample handed to the batch copy is a view of its region, which returns to the pool when the
// copy is done: the store's bytes are copied once by the store into the region, once into the
// batch.
//
// remove(handle) queues the key's removal (and its marker's) and waits for its round, so that a
// row's key is gone from the store when its fetch returns, as the reference's delete is. A key
// not there yet (a hedged request's loser, answered before its producer put the object) is
// looked for again until key_wait has passed and removed when it comes; the caller does not
// wait. A read cancelled before its object came (a hedged fetch that lost, a stop) is looked for
// still, until its deadline, and its key removed once it is there: a producer that puts after
// answering would otherwise leave it in the store. So is the key of a read that failed without its
// object (not there within key_wait, a store error: a master restarting), for another key_wait; and
// a removal the store refused is tried again until key_wait has passed (its caller hears of the
// failure at once). cache() cannot cache (hs-connectors' MooncakeTransfer has no cache): the online
// source removes.
//
// Requests and store reads overlap: loads_beside_requests() asks the online source for one more
// fetch per request in flight, so while one fetch waits for its read (or its removal) another
// holds the request slot it left (the client still bounds the requests on the wire).
//
// Thread safety: every method from any number of threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/stats_tree.h"
#include "draftfeed/source/hidden_states_transfer.h"
#include "draftfeed/source/mooncake_manifest.h"
#include "draftfeed/source/mooncake_store.h"
#include "draftfeed/source/staging_pool.h"

namespace draftfeed {

struct MooncakeTransferOptions {
  // How long a read waits for its key or its error marker, and the longest pause between two
  // looks: hs-connectors' get_sample defaults (the drop-in passes the ones in force).
  std::chrono::duration<double> key_wait{120.0};
  std::chrono::duration<double> poll_interval{0.05};
  // The staging pool grows by this much (or one object, when larger).
  std::uint64_t staging_chunk_bytes = std::uint64_t{64} << 20;
  // Keys read in one round at most (the others go in the next round, right after).
  int max_keys_per_round = 256;

  // kInvalidArgument naming the field.
  void validate() const;
};

struct MooncakeTransferStats {
  std::int64_t queued_reads = 0;       // reads waiting now for a round (new, or polled again)
  std::int64_t rounds = 0;             // rounds with the client held
  std::int64_t max_keys_in_round = 0;  // reads and removals of the largest round
  std::int64_t reads = 0;              // objects read whole
  std::uint64_t bytes_read = 0;
  std::int64_t polls = 0;          // looks at a key not there yet
  std::int64_t error_markers = 0;  // reads failed by the producer's error marker
  std::int64_t timed_out = 0;      // reads whose key did not come within key_wait
  std::int64_t wrong_size = 0;     // objects of another size than the manifest's
  std::int64_t store_errors = 0;   // other failed store calls
  std::int64_t bad_samples = 0;    // objects read whose tensors did not match the row
  std::int64_t removed = 0;        // keys removed (a marker or a missing key not counted)
  std::int64_t remove_errors = 0;
  // Keys removed once they came: of cancelled or failed reads, of removals asked before the put.
  std::int64_t orphans = 0;
  double store_seconds = 0;  // time inside rounds
  StagingStats staging;
};

template <typename Visit>
void for_each_stat(const MooncakeTransferStats& s, Visit&& visit) {
  visit("queued_reads", s.queued_reads);
  visit("rounds", s.rounds);
  visit("max_keys_in_round", s.max_keys_in_round);
  visit("reads", s.reads);
  visit("bytes_read", s.bytes_read);
  visit("polls", s.polls);
  visit("error_markers", s.error_markers);
  visit("timed_out", s.timed_out);
  visit("wrong_size", s.wrong_size);
  visit("store_errors", s.store_errors);
  visit("bad_samples", s.bad_samples);
  visit("removed", s.removed);
  visit("remove_errors", s.remove_errors);
  visit("orphans", s.orphans);
  visit("store_seconds", s.store_seconds);
  visit("staging", s.staging);
}

class MooncakeTransfer : public HiddenStatesTransfer {
 public:
  // `client` not null (kInvalidArgument); options validated.
  MooncakeTransfer(std::shared_ptr<MooncakeStoreClient> client,
                   const MooncakeTransferOptions& options);
  // Stops the reader (queued reads fail), then lets the client go before the staging memory.
  ~MooncakeTransfer() override;
  MooncakeTransfer(const MooncakeTransfer&) = delete;
  MooncakeTransfer& operator=(const MooncakeTransfer&) = delete;

  void setup() override;
  // hs-connectors' MooncakeTransfer caches nothing: always kMissing.
  FetchOutcome get_cached(std::int64_t row, const IntArrayView& input_ids) override;
  // Errors: kFormat / kUnsupported (the manifest, a tensor's shape or dtype, the object's size),
  // kMismatch (token ids), kNotFound (the key did not come within key_wait), kRuntime (the
  // producer's error marker, a store error, cancelled).
  Result<FetchedSample> get_generated(const std::string& transfer_params, const std::string& handle,
                                      std::int64_t row, std::span<const std::int64_t> ids) override;
  bool cache(const std::string& /*handle*/, std::int64_t /*row*/) override { return false; }
  // Throws Error when the store refused the removal (a missing key is not an error).
  void remove(const std::string& handle) override;
  int loads_beside_requests(int requests) const override { return requests; }
  void cancel() override;
  void resume() override;
  StatsTree stats_report() const override;

  MooncakeTransferStats stats() const;
  const MooncakeTransferOptions& options() const { return options_; }

 private:
  struct Read;
  struct Removal;
  void run();
  void serve(std::vector<std::shared_ptr<Read>>& reads,
             std::vector<std::shared_ptr<Removal>>& removals);
  std::shared_ptr<Removal> remove_later(const std::string& handle,
                                        std::chrono::steady_clock::time_point deadline);
  void watch(const Read& failed, std::chrono::steady_clock::time_point now);
  void keep_watching(const std::shared_ptr<Read>& read, std::chrono::steady_clock::time_point now);
  void settle(const std::shared_ptr<Read>& read, std::int64_t status, std::int64_t size,
              std::chrono::steady_clock::time_point now);
  Result<FetchedSample> checked(const Read& read, std::int64_t row,
                                std::span<const std::int64_t> ids);

  const MooncakeTransferOptions options_;
  StagingPool pool_;  // before client_: the client goes first, then the memory it read into
  std::shared_ptr<MooncakeStoreClient> client_;

  mutable std::mutex mutex_;
  std::condition_variable work_;             // the reader: a read or removal queued, or stop
  std::condition_variable done_;             // the callers: a read or removal ended
  std::deque<std::shared_ptr<Read>> reads_;  // queued, not yet in a round; and polled again
  std::deque<std::shared_ptr<Removal>> removals_;
  bool stopping_ = false;
  bool cancelled_ = false;
  MooncakeTransferStats stats_;
  std::thread reader_;
};

}  // namespace draftfeed
