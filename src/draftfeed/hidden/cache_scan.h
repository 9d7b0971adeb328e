// A whole-cache scan (`draftfeed verify`): every row's file (flat or sharded: cache_layout.h)
// checked against its dataset row on a pool of threads, counted by outcome and by layout, with the
// first few examples of each problem. Row by row: no folder is listed.
//
// Give the store `LockMode::kProbe` for a read-only scan: a file whose writer holds its lock is
// then counted as locked at once, and no lock file is removed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

enum class ScanStatus : std::uint8_t {
  kOk,
  kMissing,     // no file
  kCorrupt,     // unreadable: bad layout, a missing key, bad token_ids, dtype or shape, I/O error
  kMismatched,  // token ids or length differ from the row
  kNonFinite,   // NaN or Inf in hidden_states
  kLocked,      // a writer holds the lock (or, when waiting, held it past the timeout)
};
inline constexpr std::size_t kScanStatusCount = 6;

// "ok", "missing", "corrupt", "mismatched", "nonfinite", "locked" (the --json field names).
const char* scan_status_name(ScanStatus status);

enum class ScanMode {
  kValidate,  // open, check layout, compare ids, shape, dtype, finiteness
  kMemcpy,    // baseline: map each file and memcpy all of it into a buffer, nothing else
  kRead,      // baseline: map each file and read every byte once (no copy), nothing else
  // baseline: read each file through its descriptor (pread) into a 64 MiB ring of destinations:
  // the kernel's copy out of the page cache, the way the loader's batch copy reads cache files
  // (batch/file_rows_copy.h), so the bound for it
  kPread,
};

struct CacheScanOptions {
  unsigned threads = 0;          // 0: one per core
  std::size_t max_examples = 5;  // per status other than ok and missing
  ScanMode mode = ScanMode::kValidate;
  // Rows left out of the scan (not counted at all): those the caller checks another way (a packed
  // cache's, pack/pack_verify.h). Called from several threads at once.
  std::function<bool(std::int64_t)> skip_row;
};

struct ScanExample {
  std::int64_t row = 0;
  std::string reason;
};

using ScanCounts = std::array<std::int64_t, kScanStatusCount>;
using ScanExamples = std::array<std::vector<ScanExample>, kScanStatusCount>;

// Rows counted by status, with examples, tallied by each thread on its own and merged after (a
// scan's findings, a conversion's skipped rows): `counts` and `examples` get `thread_counts` and
// `thread_examples` (moved) added.
void merge_by_status(ScanCounts& counts, ScanExamples& examples, const ScanCounts& thread_counts,
                     ScanExamples& thread_examples);
// Once every thread is merged: each status's examples lowest rows first, at most `max_examples`
// (each thread kept its own lowest rows, so these are the lowest of all).
void keep_lowest_examples(ScanExamples& examples, std::size_t max_examples);

struct CacheScanReport {
  std::int64_t rows = 0;
  ScanCounts counts{};
  ScanExamples examples;                                  // lowest rows first
  std::uint64_t bytes = 0;                                // sizes of the files opened
  std::array<std::int64_t, kCacheLayoutCount> layouts{};  // files found, by layout (cache_layout.h)
  double seconds = 0;
  unsigned threads = 0;
  // kRead only: the XOR of every 8-byte word read (zero-padded tail), so the reads are not
  // optimised away; the same value for the same bytes.
  std::uint64_t read_checksum = 0;

  std::int64_t count(ScanStatus status) const { return counts[static_cast<std::size_t>(status)]; }
  // True when nothing but ok and missing was found.
  bool clean() const;
};

// The classification of one check's problem.
ScanStatus scan_status_of(SampleProblem problem);

// Scans rows [0, num_rows). `ids_of_row` must be callable from several threads at once and return
// ids that stay valid during the scan (a TokenDataset's views do).
CacheScanReport scan_cache(const CacheStore& store, std::int64_t num_rows,
                           const std::function<RowIds(std::int64_t)>& ids_of_row,
                           const CacheScanOptions& options = {});

}  // namespace draftfeed
