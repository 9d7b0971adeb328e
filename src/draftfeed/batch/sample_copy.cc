#include "draftfeed/batch/sample_copy.h"

#include <string>

#include "draftfeed/batch/compressed_rows_copy.h"
#include "draftfeed/batch/file_rows_copy.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fault_guard.h"

namespace draftfeed {

void SampleCopy::copy_rows(const BatchLayout& layout, const BatchMemory& batch,
                           const SamplePlacement& placement, const FetchedSample& sample,
                           std::int64_t global_row, const NoiseContext& noise, std::int64_t first,
                           std::int64_t last) {
  if (sample.compressed) {
    const CompressedRowsCopy copied =
        copy_compressed_rows(layout, batch, placement, sample, global_row, noise, first, last);
    if (copied.bad_chunk >= 0) {
      std::int64_t none = -1;
      if (bad_chunk_.compare_exchange_strong(none, copied.bad_chunk)) bad_status_ = copied.status;
    }
    record(copied.nonfinite, !copied.faulted);
    return;
  }
  if (can_read_file_rows(sample)) {
    const FileRowsCopy copied =
        copy_file_rows(layout, batch, placement, sample, global_row, noise, first, last);
    record(copied.nonfinite, !copied.unreadable);
    return;
  }
  std::int64_t bad = 0;
  const bool read = guard_mapped_reads([&] {
    bad = copy_sample_rows(layout, batch, placement, sample.hidden, global_row, noise, first, last);
  });
  if (sample.file) {
    const HiddenStatesView& hs = sample.hidden;
    const std::size_t row_bytes =
        static_cast<std::size_t>(hs.layers * hs.hidden) * dtype_size(hs.dtype);
    sample.file->release(hs.data + static_cast<std::size_t>(first) * row_bytes,
                         hs.data + static_cast<std::size_t>(last) * row_bytes);
  }
  record(bad, read);
}

void SampleCopy::record(std::int64_t nonfinite, bool read) {
  if (!read) shrank_.store(true, std::memory_order_relaxed);
  if (nonfinite != 0) nonfinite_.fetch_add(nonfinite, std::memory_order_relaxed);
}

std::optional<FetchOutcome> SampleCopy::finish(const FetchedSample& sample,
                                               std::int64_t global_row) {
  const std::int64_t bad = nonfinite_.exchange(0);
  const bool shrank = shrank_.exchange(false);
  const std::int64_t bad_chunk = bad_chunk_.exchange(-1);
  if (sample.compressed && sample.file) {
    // The blob's pages leave this process's memory once the sample is copied (the page cache
    // keeps them): once per sample, not per copy chunk, since each release interrupts the other
    // copy threads (a TLB shootdown; docs/decisions.md has what that cost).
    const CompressedPlanes& blob = *sample.compressed;
    sample.file->release(blob.data, blob.data + blob.planes.blob_bytes);
  }
  const std::string row = "row " + std::to_string(global_row) + ": ";
  if (shrank) {
    return FetchOutcome::dropped(
        DropReason::kInvalid,
        row + (sample.file ? sample.file->path() : std::string("the hidden states")) +
            ": the file shrank while being copied (truncated by another process: a short "
            "read, or SIGBUS on the mapping)");
  }
  if (auto change = sample.file ? sample.file->change_since_mapped() : std::nullopt) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 row + sample.file->path() + ": the file " + *change);
  }
  if (bad_chunk >= 0 && sample.compressed) {
    const CompressedPlanes& blob = *sample.compressed;
    return FetchOutcome::dropped(
        DropReason::kInvalid,
        row + blob.where + ": hidden_states: " +
            PlaneChunkDecoder::error(blob.planes, static_cast<std::size_t>(bad_chunk), bad_status_)
                .what());
  }
  if (bad != 0) {
    return FetchOutcome::dropped(DropReason::kNonFinite,
                                 row + std::to_string(bad) + " non-finite hidden-state values");
  }
  return std::nullopt;
}

}  // namespace draftfeed
