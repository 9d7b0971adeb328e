// Converting a hidden-state cache to hs-connectors' FP8 files (`draftfeed quantize`), in place or
// into another folder, on a pool of threads.
//
// Per row of the range:
//   * the source file is read under the lock protocol without waiting (LockMode::kProbe: a file
//     whose writer holds its lock is skipped as locked, and no lock file is removed) and checked as
//     `draftfeed verify` checks it (validate.h, values included). A file that fails is left as it
//     is and counted by reason, with the first examples; a missing file is counted as missing;
//   * a bf16/f16/f32 file is quantized (fp8_quantize.h) and written atomically: a temporary file
//     beside the target, renamed over it, so a reader sees the old file or the new one;
//   * an FP8 file is already done (in place), or copied as it is (into another folder);
//   * into another folder, a target that is already a valid FP8 file of the row is kept: running
//     the conversion again after an interruption does only what is left (in place, likewise,
//     because converted files are FP8).
// The folder written (the cache in place, else the target) is locked for the whole run
// (hidden/cache_rewrite.h): a second rewrite of it waits `rewrite.lock_wait`, then is refused.
// Thread safety: `progress` may be read from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "draftfeed/hidden/cache_rewrite.h"
#include "draftfeed/hidden/cache_scan.h"
#include "draftfeed/hidden/cache_store.h"

namespace draftfeed {

struct CacheConvertOptions {
  CacheRewriteOptions rewrite;  // where the FP8 files go (empty: in place), threads, lock wait
  // Where the FP8 files go (cache_layout.h). Unset: in place, each file stays where it is; into
  // another folder, flat. Set in place, a file in the other layout moves there (written anew,
  // or renamed when already FP8), so the whole cache ends up in one layout.
  std::optional<CacheLayout> layout;
  bool fsync = false;  // fsync each new file before its rename (always done in place)

  void validate() const { rewrite.validate(); }
};

struct CacheConvertReport : CacheRewriteReport {
  std::int64_t converted = 0;    // quantized and written
  std::int64_t already_fp8 = 0;  // FP8 already (in place), or a valid FP8 target kept
  std::int64_t moved = 0;        // of those in place, renamed into the layout asked for
  std::int64_t copied = 0;       // FP8 sources copied into the target folder
  std::int64_t missing = 0;      // no source file
  // bytes_before: the source files of the rows that have an FP8 file now; bytes_after: theirs.
};

// CacheConvertReport's own fields under their reported names (common/stats_tree.h).
template <typename Visit>
void for_each_stat(const CacheConvertReport& r, Visit&& visit) {
  visit("converted", r.converted);
  visit("already_fp8", r.already_fp8);
  visit("moved", r.moved);
  visit("copied", r.copied);
  visit("missing", r.missing);
}

// Converts rows [begin, end) of `source` (give it LockMode::kProbe). `ids_of_row` as for
// scan_cache. Throws the writer lock's Error when another rewrite holds the folder (kTimeout naming
// it), Error(kIo) naming the folder or file when the target folder cannot be created or a file
// cannot be written (a full disk ends the run; the temporary file is removed, the old
// file stays): the rows done so far are done, and a second run goes on from there.
CacheConvertReport convert_cache_to_fp8(const CacheStore& source, std::int64_t begin,
                                        std::int64_t end,
                                        const std::function<RowIds(std::int64_t)>& ids_of_row,
                                        const CacheConvertOptions& options,
                                        CacheRewriteProgress* progress = nullptr);

}  // namespace draftfeed
