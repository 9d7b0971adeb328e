// Keeping generated hidden states in a cache folder's pack, within a disk budget, while training
// reads (docs/protocol.md, "Generated rows kept in a pack"): the online source's on_generate =
// pack, and `draftfeed generate --pack`.
//
// The fetch threads only offer a validated sample (its file's mapping, kept alive until it is
// encoded); one thread of the appender's own encodes each (the plane codec when compressing) into
// the shard it assembles in memory. A shard that holds `shard_bytes` (or at flush) is written
// durably to a temporary file of this process (fsync), still without any lock; then it is
// committed under the folder's writer lock (common/folder_lock.h), held only for the commit, so
// that ranks, hosts and other runs pointed at the folder take turns:
//   * the manifest is read afresh (what the others committed since), this host's dead writers'
//     temporaries removed;
//   * the shard is dropped when the pack would go past the budget (the bytes of its shards and
//     manifest), or when every row it holds is in the pack already (another writer kept them);
//   * else it is renamed to the next shard name, the folder fsynced, and the manifest naming it
//     (and only its rows the pack lacked) written durably.
// A commit that cannot get the lock within `lock_wait` (a `draftfeed pack` holding it) drops its
// shard rather than wait: writing never holds up training, and a dropped shard costs only the
// generation of its rows, which later epochs ask the servers for again. A run killed at any point
// loses only generation work: the manifest names whole, durable shards only, and the next writer
// removes the temporary left behind.
//
// Offers beyond what the queue may hold (`queue_bytes` of samples waiting to be encoded) or once
// the budget is reached are refused (not kept: the row is generated again next epoch).
// Thread safety: offer, flush and stats may be called from any number of threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/stats_tree.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/pack/plane_codec.h"
#include "draftfeed/pack/shard_layout.h"

namespace draftfeed {

inline constexpr std::uint64_t kDefaultKeepShardBytes = std::uint64_t{256} << 20;
// Generated files offered and not yet encoded, at most, by default: their mappings (pages the
// servers' writes left in the page cache) held a little longer, not memory of their own.
inline constexpr std::uint64_t kDefaultKeepQueueBytes = std::uint64_t{1} << 30;

struct PackAppendOptions {
  std::string root;  // the cache folder
  std::uint64_t budget_bytes =
      0;  // the pack's bytes on disk at most (shards and manifest); 0: none
  std::uint64_t shard_bytes = kDefaultKeepShardBytes;  // encoded bytes per shard (memory bound)
  bool compress = true;                                // hidden states through the plane codec
  PlaneCodecOptions codec;
  // How long a commit waits for the folder's writer lock before its shard is dropped.
  std::chrono::duration<double> lock_wait{2.0};
  std::uint64_t queue_bytes = kDefaultKeepQueueBytes;       // offered and not yet encoded, at most
  std::string what = "draftfeed (keeping generated rows)";  // the lock holder's description

  // The only check of these fields: Error(kInvalidArgument) naming the field.
  void validate() const;
};

struct PackAppendStats {
  std::int64_t offered = 0;         // samples offered
  std::int64_t kept = 0;            // samples named by a manifest this appender wrote
  std::int64_t refused_full = 0;    // offers refused: the budget was reached
  std::int64_t refused_queue = 0;   // offers refused: the queue was full (encoding behind)
  std::int64_t duplicates = 0;      // samples another writer had kept first
  std::int64_t dropped_budget = 0;  // samples of shards dropped at commit: past the budget
  std::int64_t dropped_lock = 0;    // samples of shards dropped: the lock was not had in time
  std::int64_t failed = 0;          // samples lost to a write or encode failure (said in the log)
  std::int64_t shards = 0;          // shards committed
  std::uint64_t kept_bytes = 0;     // bytes of the shards committed
  std::uint64_t pack_bytes = 0;     // the pack's bytes (shards and manifest), as last seen
  std::uint64_t budget_bytes = 0;   // 0: none
  std::uint64_t queued_bytes = 0;   // waiting to be encoded now
  bool full = false;                // the budget is reached: nothing more is kept
  double commit_seconds = 0;        // under the writer lock, summed
};

// Each statistic under its reported name (common/stats_tree.h).
template <typename Visit>
void for_each_stat(const PackAppendStats& s, Visit&& visit) {
  visit("offered", s.offered);
  visit("kept", s.kept);
  visit("refused_full", s.refused_full);
  visit("refused_queue", s.refused_queue);
  visit("duplicates", s.duplicates);
  visit("dropped_budget", s.dropped_budget);
  visit("dropped_lock", s.dropped_lock);
  visit("failed", s.failed);
  visit("shards", s.shards);
  visit("kept_bytes", s.kept_bytes);
  visit("pack_bytes", s.pack_bytes);
  visit("budget_bytes", s.budget_bytes);
  visit("queued_bytes", s.queued_bytes);
  visit("full", s.full);
  visit("commit_seconds", s.commit_seconds);
}

class PackAppender {
 public:
  // Reads the folder's pack once (its bytes against the budget); throws the Error of a manifest
  // that does not parse, or of options that do not validate.
  explicit PackAppender(PackAppendOptions options);
  // Commits what is held (flush), then stops its thread.
  ~PackAppender();
  PackAppender(const PackAppender&) = delete;
  PackAppender& operator=(const PackAppender&) = delete;

  // Offers `row`'s validated per-sample file (its mapping kept until encoded): false when it is
  // not kept (the budget reached, the queue full). Never blocks on a write.
  bool offer(std::int64_t row, std::shared_ptr<const SafetensorsFile> file);
  // Commits the samples offered so far as a shard, and waits until that is done (or dropped):
  // at an epoch's end, so that the next epoch reads them.
  void flush();
  // The same without waiting (the last row of an epoch fetched: the commit overlaps the epoch's
  // last copies and steps).
  void flush_async();
  // Whether the budget is reached (offers are refused).
  bool full() const;
  PackAppendStats stats() const;
  // Messages of failed writes and dropped shards, oldest first (then cleared).
  std::vector<std::string> take_messages();

 private:
  struct Offer {
    std::int64_t row;
    std::shared_ptr<const SafetensorsFile> file;
    std::uint64_t bytes;
  };
  void run();
  // Writes the assembled shard and commits it (the lock taken for the commit only).
  void commit(std::vector<EncodedSample> samples);
  void note(std::string message);

  const PackAppendOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // an offer, a flush, or the end
  std::condition_variable done_;  // a flush's commit ended
  std::deque<Offer> queue_;
  std::uint64_t flush_asked_ = 0;  // flushes asked for, and done
  std::uint64_t flush_done_ = 0;
  bool stopping_ = false;
  // The pack's bytes as last seen (at start and at each commit), plus the shard being assembled:
  // what offers are weighed against.
  std::uint64_t pending_bytes_ = 0;
  PackAppendStats stats_;
  std::vector<std::string> messages_;
  std::thread thread_;
};

// "500GB", "1.5TB", "64MiB", "1000000": a byte count as the command line and Python take it (k, M,
// G, T and P in powers of 1000; Ki, Mi, Gi, Ti and Pi in powers of 1024; a trailing B optional).
// Throws Error(kInvalidArgument) naming `what` for anything else.
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace draftfeed
