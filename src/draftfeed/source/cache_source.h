// The offline sample source: hidden states from the cache folder (`hs_<row>.safetensors`, flat or
// sharded: cache_layout.h), checked against the dataset row before anything is copied. Finiteness
// is checked later, inside the copy. The epoch's files are opened and read ahead in plan order
// (file_read_ahead.h), so a cold cache streams at the disk's speed and a network file system's
// round trips overlap instead of adding up.
// Files may be bf16/f16/f32 or hs-connectors' FP8 (F8_E4M3 with per-token scales), mixed in one
// folder: FP8 values are dequantized in the copy as FP8Transfer does, in `fp8_dequantize_dtype`.
// A folder holding a packed cache (manifest.json) serves the rows it names from its shards
// (source/packed_fetch.h), the others from their files; the read-ahead reads the packed rows by
// their byte ranges in their shards, in the same plan order. A rewrite of the folder while the
// source runs (pack, unpack) is followed: the manifest is looked at again at each epoch's start,
// and when a row is found nowhere (pack/live_packed_cache.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/pack/live_packed_cache.h"
#include "draftfeed/read_ahead/file_read_ahead.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

// What to do with a row that has no cached file (the reference's `on_missing`): generate it (the
// online source), or drop it silently (skip), with a warning (warn), or end the run (raise).
enum class OnMissing : std::uint8_t { kGenerate, kSkip, kWarn, kRaise };
OnMissing parse_on_missing(std::string_view text);  // throws kInvalidArgument naming the choices
const char* on_missing_name(OnMissing on_missing);

// How the batch copy (batch/sample_copy.h) takes a cache file's rows: from its mapping, or read
// through the file's descriptor (batch/file_rows_copy.h); the source says which in
// FetchedSample::read_rows. kAuto maps, on every file system:
//   - on a network or FUSE one (common/file_system.h) each read() of a file whose attributes the
//     client holds longer than its attribute timeout asks the server for them first, one round trip
//     per file in the copy, while a fault on a mapping of cached pages asks nothing (the read-ahead
//     has read the file into the page cache by then);
//   - on a local one, where the page cache holds a file the writer left there in large folios, one
//     fault maps a whole folio, while the read scatters a token's layers with one small iovec each.
// The read is the faster where the page cache holds the files in small folios: a cache read from a
// local disk (larger than memory, or an epoch after the cache left the page cache), where a fault
// maps little and each release unmaps it again (docs/decisions.md: the mapped copy against the
// read). The environment variable DRAFTFEED_CACHE_COPY (read, map or auto) overrides kAuto, for
// such a cache and for tests.
enum class CacheCopy : std::uint8_t { kAuto, kRead, kMap };
CacheCopy parse_cache_copy(std::string_view text);  // throws kInvalidArgument naming the choices
const char* cache_copy_name(CacheCopy copy);

// The cache folder and how it is read: the cache source's options, and the online source's cache
// (it looks there first).
struct CacheSourceOptions {
  std::string hidden_states_path;                    // the cache folder
  OnMissing on_missing = OnMissing::kSkip;           // generate needs the online source
  std::chrono::duration<double> lock_timeout{10.0};  // how long a writer's lock is waited for
  std::chrono::duration<double> lock_poll{0.1};
  // FP8 files' values are dequantized in this dtype, as FP8Transfer's dequantize_dtype: bf16,
  // f16 or f32.
  DType fp8_dequantize_dtype = DType::kBF16;
  CacheCopy copy = CacheCopy::kAuto;

  // Whether the copy reads the rows (else it maps them), as `copy` or DRAFTFEED_CACHE_COPY decide
  // (see CacheCopy). Throws kInvalidArgument for a bad DRAFTFEED_CACHE_COPY.
  bool rows_are_read() const;

  // The only check of these fields (and of the store's, see store()): Error kInvalidArgument
  // naming the field.
  void validate() const;
  // The store that reads the folder under the lock protocol.
  CacheStoreOptions store() const;
};

class CacheSampleSource : public SampleSource {
 public:
  // Throws kInvalidArgument for bad options; on_missing = generate is the online source's.
  explicit CacheSampleSource(const CacheSourceOptions& options);
  // The same over `store` (options.store() or one it allows more of), shared with its owner.
  CacheSampleSource(std::shared_ptr<const CacheStore> store, const CacheSourceOptions& options,
                    FileReadAheadOptions read_ahead = {});
  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;
  // The epoch's files are opened and read ahead in this order (read_ahead/file_read_ahead.h),
  // after a look at the folder's manifest (a rewrite since is read now). Throws the Error of a
  // manifest that changed and no longer reads.
  void will_need(const ReadAheadPlan& plan) override;
  // The pipeline stops: what was prepared ahead is dropped, at once and again once its threads
  // have joined.
  void interrupt() override;
  void resume() override;
  FileReadAheadStats read_ahead_stats() const { return read_ahead_->stats(); }
  ReadAheadMemory read_ahead_memory() const override { return read_ahead_->stats().memory; }
  // Whether the read-ahead has done all the plan and its budgets let it (FileReadAhead::settled).
  bool read_ahead_settled() const { return read_ahead_->settled(); }
  // {"read_ahead": the file read-ahead's statistics}.
  StatsTree stats_report() const override;
  // On a network file system a fetch may wait for its file's open: one of a tail of seconds, until
  // the read-ahead's second ask answers (tens of ms). Threads of their own for such waits, so that
  // the copies of the other batches go on meanwhile (none where opens are local).
  int blocking_fetches() const override { return blocking_fetches_; }

  // Checks a loaded file against the row: token ids (int64 [T], equal to the row), hidden states
  // (bf16/f16/f32 [T, L, H], or F8_E4M3 with its scales). Shared with the online source.
  // `read_rows`: the copy reads the rows through the descriptor (else from the mapping: see
  // CacheCopy).
  static FetchOutcome check(std::int64_t global_row, const IntArrayView& input_ids,
                            const HiddenStateSample& sample, DType fp8_dequantize_dtype,
                            bool read_rows = true);

 private:
  std::shared_ptr<const CacheStore> store_;
  const CacheSourceOptions options_;
  const bool read_rows_;  // options_.rows_are_read(), decided once
  const int blocking_fetches_;
  // The fetch of a row from `pack` (may be null) or its file, without the on_missing policy.
  FetchOutcome fetch_once(const PackedCache* pack, std::int64_t global_row,
                          const IntArrayView& input_ids);

  // The folder's packed cache as it is now (source/packed_fetch.h): its rows are read from shards.
  std::shared_ptr<LivePackedCache> pack_;
  std::unique_ptr<FileReadAhead> read_ahead_;
};

}  // namespace draftfeed
