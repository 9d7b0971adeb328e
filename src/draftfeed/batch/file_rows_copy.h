// The batch copy of a sample whose hidden states lie in a cache file opened with its descriptor
// kept: the rows are read from the file (MappedFile::read_at), a slice of about kSliceBytes at a
// time, never through the file's mapping. Two ways:
//   - straight into the batch, when the bytes go there unchanged (the batch holds the file's dtype,
//     no noise, not MTP): one vectored read scatters each token's target layers and last layer to
//     their batch rows (the EAGLE-3 shift included); then, while the slice is still in the core's
//     cache, the finiteness check;
//   - through a staging buffer of the copying thread (noise, any cast, FP8 with its scales, MTP):
//     the slice is read into it and copied from there (copy_sample_rows: cast, noise and
//     finiteness check fused, streaming stores into the batch); the buffer stays in the core's
//     L2, so that copy reads cache, not memory.
//
// The read copy of SampleCopy (sample_copy.h), for a sample whose source asks for it
// (FetchedSample::read_rows: source/cache_source.h's CacheCopy). No page of the rows is mapped:
// no page faults, no TLB shootdown to unmap them, and the file's pages never count in this
// process's memory; a read instead copies a token's layers with one small iovec each and pays the
// kernel's per-folio work. docs/decisions.md says when each copy is the faster.
#pragma once

#include <cstddef>
#include <cstdint>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/sample/fetched_sample.h"

namespace draftfeed {

// Bytes of one slice: well inside a core's L2 (1-2 MB on the CPUs a loader runs on), so the pass
// after the read finds it in cache, and large enough that a read's fixed cost (a syscall, a
// page-cache lookup) is a few percent.
inline constexpr std::size_t kSliceBytes = std::size_t{512} << 10;

struct FileRowsCopy {
  std::int64_t nonfinite = 0;
  // The file no longer holds the rows (it shrank under the read, or the read failed): the
  // sample must be dropped, as when a mapped read raises SIGBUS.
  bool unreadable = false;
};

// Whether `sample` is copied by copy_file_rows (a file opened with its descriptor kept, whose rows
// its source wants read: FetchedSample::read_rows).
bool can_read_file_rows(const FetchedSample& sample);

// copy_sample_rows for rows [first, last) of `sample`, read from its file.
FileRowsCopy copy_file_rows(const BatchLayout& layout, const BatchMemory& batch,
                            const SamplePlacement& placement, const FetchedSample& sample,
                            std::int64_t global_row, const NoiseContext& noise, std::int64_t first,
                            std::int64_t last);

}  // namespace draftfeed
