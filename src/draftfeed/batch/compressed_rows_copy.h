// The batch copy of hidden states left compressed in a packed cache's shard
// (FetchedSample::compressed, pack/plane_codec.h): rows [first, last) are decoded a slice at a
// time into a staging buffer of the copying thread, from the codec chunks that hold them only, and
// copied from there while the slice is still in the core's cache (copy_sample_rows: cast, noise
// and finiteness check in one pass). So the decode is spread over the pipeline's copy threads with
// the copy, no sample is decoded whole, and decoded bytes never go to memory before the batch.
//
// A codec chunk that straddles two slices is decoded once into a chunk buffer and serves both; one
// that straddles two copy chunks is decoded by both. The blob is read from the mapping under the
// fault guard; the buffers and the zstd context are made before it (nothing inside allocates).
#pragma once

#include <cstddef>
#include <cstdint>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/pack/plane_codec.h"
#include "draftfeed/sample/fetched_sample.h"

namespace draftfeed {

// Decoded bytes of one slice: with the chunk buffer and the exponent plane, well inside a core's
// L2, where the copy's pass finds it.
inline constexpr std::size_t kDecodeSliceBytes = std::size_t{256} << 10;

// Rows per copy chunk of a compressed sample, for a pipeline that splits others in chunks of
// `chunk_rows`: fewer (kCompressedChunkShare of them), since a compressed row costs its copy
// several times more than a plain one and the threads share a batch's work by chunks; a multiple
// of the rows of one codec chunk when a codec chunk is whole rows, so that no codec chunk is
// decoded by two copy chunks.
inline constexpr std::int64_t kCompressedChunkShare = 8;
std::int64_t compressed_chunk_rows(const FetchedSample& sample, std::int64_t chunk_rows);

struct CompressedRowsCopy {
  std::int64_t nonfinite = 0;
  bool faulted = false;  // the mapping raised SIGBUS (the shard shrank)
  // The first codec chunk that did not decode (-1: none), and what its decode said.
  std::int64_t bad_chunk = -1;
  PlaneChunkDecoder::Status status;
};

// copy_sample_rows for rows [first, last) of `sample` (whose `compressed` is set), decoded from
// its blob; the rows of a bad chunk are not copied.
CompressedRowsCopy copy_compressed_rows(const BatchLayout& layout, const BatchMemory& batch,
                                        const SamplePlacement& placement,
                                        const FetchedSample& sample, std::int64_t global_row,
                                        const NoiseContext& noise, std::int64_t first,
                                        std::int64_t last);

}  // namespace draftfeed
