// One home for the commands that rewrite a cache folder: `draftfeed pack`, `unpack` and `quantize`
// (pack/pack_writer.h, hidden/fp8_convert.h). What they share is here, once:
//   * the options every rewrite takes (where the result goes, threads, examples, how long to wait
//     for another writer), checked by CacheRewriteOptions::validate;
//   * the folder's writer lock (common/folder_lock.h), taken by CacheRewrite for the whole run on
//     the folder being written (the cache itself in place, the target folder otherwise), so that
//     two rewrites never interleave, on one host or on many; readers take no lock;
//   * the progress a progress bar reads while the rewrite runs, and the report's common part:
//     rows, rows left as they were by reason (with the first examples), bytes before and after,
//     seconds, threads, the time spent waiting for the lock.
// Thread safety: CacheRewriteProgress may be read from any thread while a rewrite runs; the rest is
// used by the rewrite's own thread (its workers tally into reports of their own, merged after).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "draftfeed/common/folder_lock.h"
#include "draftfeed/hidden/cache_scan.h"

namespace draftfeed {

struct CacheRewriteOptions {
  std::string target_root;  // empty: in place, into the source cache's own folder
  unsigned threads = 0;     // 0: one per core
  std::size_t max_examples = 5;
  // How long to wait for another writer's lock on the folder before refusing (0: refuse at once).
  std::chrono::duration<double> lock_wait{0.0};

  // The only check of these fields: Error(kInvalidArgument) naming the field.
  void validate() const;
  // `threads`, or one per core, at least 1 and at most `work` (when given).
  unsigned thread_count(std::int64_t work = 0) const;
};

struct CacheRewriteProgress {
  std::atomic<std::int64_t> rows_done{0};
  std::atomic<std::uint64_t> bytes_before{0};
  std::atomic<std::uint64_t> bytes_after{0};
};

struct CacheRewriteReport {
  std::int64_t rows = 0;
  // Rows left as they were, by what `draftfeed verify` would call them, with the first examples.
  ScanCounts skipped{};
  ScanExamples examples;
  std::uint64_t bytes_before = 0;
  std::uint64_t bytes_after = 0;
  double seconds = 0;
  unsigned threads = 0;
  double lock_wait_seconds = 0;  // waiting for another writer's lock

  void skip(ScanStatus status, std::int64_t row, std::string reason, std::size_t max_examples);
  std::int64_t skipped_total() const;
  // A worker's tally added in (its examples moved); call keep_lowest_examples once all are in.
  void merge(CacheRewriteReport& other);
};

// The folder a rewrite writes, locked for as long as this lives.
class CacheRewrite {
 public:
  // `source_root` is the cache being rewritten; the folder written is options.target_root
  // (created) or, in place, `source_root`. `what` names the rewrite for another writer's message
  // ("draftfeed pack"). Throws the lock's Error (kTimeout naming the holder, ...) or kIo when the
  // target folder cannot be created.
  CacheRewrite(const std::string& source_root, const CacheRewriteOptions& options,
               const std::string& what);

  bool in_place() const { return in_place_; }
  const std::string& root() const { return root_; }  // the folder written
  const FolderLock& lock() const { return lock_; }
  // The report's time, threads and lock wait, from this rewrite's start.
  void finish(CacheRewriteReport& report, unsigned threads) const;

 private:
  bool in_place_;
  std::string root_;
  std::chrono::steady_clock::time_point start_;
  FolderLock lock_;
};

}  // namespace draftfeed
