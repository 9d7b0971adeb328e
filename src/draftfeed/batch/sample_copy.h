// The copy of one fetched sample's hidden-state rows into its place in a batch: the one place
// where the rows a source fetched (a mapped cache file, memory a transfer gave) are copied into a
// batch. The pipeline only schedules it: it splits each placed sample into chunks, has threads
// copy them (copy_rows), and once every chunk of the batch is copied asks each sample whether it
// must be dropped (finish).
//
// What the copy guards against, and why here:
//   - a mapped file another process truncates while it is copied raises SIGBUS on the copying
//     thread, which would kill the trainer: the copy runs under a fault guard (common/
//     fault_guard.h) and the sample is dropped instead, its message naming the file;
//   - a file rewritten meanwhile (a new size or modification time) gave bytes of two versions:
//     the sample is dropped once its copy is done (MappedFile::change_since_mapped);
//   - NaN or Inf in the copied rows (found by the copy's kernels) drops the sample too.
// Once a chunk's rows are in the batch, its file pages leave this process's memory (they stay
// in the page cache): a loader that kept a batch's files mapped would hold that batch twice. A
// compressed sample's blob leaves once, when the whole sample is copied (finish).
// A cache file whose source asks for the rows to be read (FetchedSample::read_rows) is copied
// through its descriptor instead (file_rows_copy.h): no mapping to guard or release there; a
// file that shrank under the read is dropped as one that faulted. Hidden states left compressed in
// a packed cache's shard (FetchedSample::compressed) are decoded by the copy, the codec chunks of
// its rows only (compressed_rows_copy.h); a chunk that does not decode drops the sample, its
// message naming the shard, the offset, the row and the chunk.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/sample/fetched_sample.h"

namespace draftfeed {

// One sample's copy into a batch. copy_rows may run from any threads at once, for disjoint chunks;
// finish after all of them.
class SampleCopy {
 public:
  // Copies rows [first, last) (relative to `placement`) of `sample` into `batch` (copy_sample_rows:
  // cast, noise and finiteness check in one pass), under the fault guard; then releases the
  // file's pages of those rows. Or reads them (copy_file_rows), when the sample asks for it.
  // `global_row` keys the noise.
  void copy_rows(const BatchLayout& layout, const BatchMemory& batch,
                 const SamplePlacement& placement, const FetchedSample& sample,
                 std::int64_t global_row, const NoiseContext& noise, std::int64_t first,
                 std::int64_t last);

  // After every chunk was copied: the drop this sample gets, if any (its file shrank in the copy,
  // its file changed since it was mapped, a compressed chunk did not decode, or it held non-finite
  // values), with a message naming the row and the file; nothing if its rows in the batch are
  // good. Releases a compressed sample's blob pages. Resets what the copies found, for a copy
  // again after the batch is repacked.
  std::optional<FetchOutcome> finish(const FetchedSample& sample, std::int64_t global_row);

 private:
  // What one chunk's copy found: `read` false when the file shrank under it.
  void record(std::int64_t nonfinite, bool read);

  std::atomic<std::int64_t> nonfinite_{0};
  std::atomic<bool> shrank_{false};  // a copy faulted (SIGBUS) or read short: the file shrank
  // The first compressed chunk that did not decode (-1: none), and what its decode said (written
  // by the copy that set bad_chunk_, read by finish after every copy).
  std::atomic<std::int64_t> bad_chunk_{-1};
  PlaneChunkDecoder::Status bad_status_;
};

}  // namespace draftfeed
