#include "draftfeed/batch/compressed_rows_copy.h"

#include <algorithm>
#include <cstring>

#include "draftfeed/batch/thread_buffer.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/mapped_file.h"

namespace draftfeed {

namespace {

thread_local ThreadBuffer slice_buffer;  // a slice's decoded rows
thread_local ThreadBuffer chunk_buffer;  // a codec chunk that straddles two slices
thread_local PlaneChunkDecoder decoder;

// Decodes values [begin, end) of a blob into `out`: the chunks inside the range straight there,
// the one or two it only partly covers through the chunk buffer (kept across the calls of one
// copy, so the chunk two slices share is decoded once).
class RangeDecoder {
 public:
  RangeDecoder(const CompressedPlanes& blob, std::uint8_t* chunk)
      : blob_(blob), planes_(blob.planes), elem_(dtype_size(planes_.dtype)), chunk_(chunk) {}

  // False when a chunk does not decode (`bad_chunk`, `status` say which and why).
  bool decode(std::uint64_t begin, std::uint64_t end, std::uint8_t* out) {
    if (begin >= end) return true;
    for (std::size_t c = planes_.chunk_of(begin); c <= planes_.chunk_of(end - 1); ++c) {
      const std::uint64_t chunk_first = planes_.chunk_first(c);
      const std::uint64_t chunk_end = chunk_first + planes_.chunk_count(c);
      const std::uint64_t from = std::max(begin, chunk_first);
      const std::uint64_t to = std::min(end, chunk_end);
      std::uint8_t* at = out + (from - begin) * elem_;
      if (from == chunk_first && to == chunk_end) {
        if (!decode_chunk(c, at)) return false;
        continue;
      }
      if (held_ != static_cast<std::int64_t>(c)) {
        if (!decode_chunk(c, chunk_)) return false;
        held_ = static_cast<std::int64_t>(c);
      }
      std::memcpy(at, chunk_ + (from - chunk_first) * elem_, (to - from) * elem_);
    }
    return true;
  }

  std::int64_t bad_chunk = -1;
  PlaneChunkDecoder::Status status;

 private:
  bool decode_chunk(std::size_t c, std::uint8_t* out) {
    status = decoder.decode(planes_, blob_.data, c, out);
    if (!status.ok) bad_chunk = static_cast<std::int64_t>(c);
    return status.ok;
  }

  const CompressedPlanes& blob_;
  const PlaneBlob& planes_;
  std::size_t elem_;
  std::uint8_t* chunk_;
  std::int64_t held_ = -1;  // the chunk in `chunk_`
};

}  // namespace

std::int64_t compressed_chunk_rows(const FetchedSample& sample, std::int64_t chunk_rows) {
  const std::int64_t rows = std::max<std::int64_t>(1, chunk_rows / kCompressedChunkShare);
  const std::int64_t row_values = sample.hidden.layers * sample.hidden.hidden;
  const std::int64_t chunk_values = sample.compressed->planes.chunk_values;
  if (row_values <= 0 || chunk_values % row_values != 0) return rows;
  const std::int64_t codec_rows = chunk_values / row_values;
  return std::max(codec_rows, rows / codec_rows * codec_rows);
}

CompressedRowsCopy copy_compressed_rows(const BatchLayout& layout, const BatchMemory& batch,
                                        const SamplePlacement& placement,
                                        const FetchedSample& sample, std::int64_t global_row,
                                        const NoiseContext& noise, std::int64_t first,
                                        std::int64_t last) {
  const HiddenStatesView& hs = sample.hidden;
  const CompressedPlanes& blob = *sample.compressed;
  const std::size_t elem = dtype_size(hs.dtype);
  const auto row_values = static_cast<std::uint64_t>(hs.layers * hs.hidden);
  const std::size_t row_bytes = std::max<std::size_t>(1, row_values * elem);
  const std::int64_t shift = copy_row_lookahead(layout.spec);
  const std::int64_t slice_rows =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(kDecodeSliceBytes / row_bytes));
  // Made here, outside the guard: room for a slice and the rows the shift reads past it.
  std::uint8_t* slice =
      slice_buffer.at_least(static_cast<std::size_t>(slice_rows + shift) * row_bytes);
  decoder.reserve(blob.planes.chunk_values);
  RangeDecoder range(blob, chunk_buffer.at_least(std::size_t{blob.planes.chunk_values} * elem));
  CompressedRowsCopy result;
  result.faulted = !guard_mapped_reads([&] {
    for (std::int64_t begin = first; begin < last; begin += slice_rows) {
      const std::int64_t end = std::min(last, begin + slice_rows);
      const std::int64_t stop = std::min(hs.tokens, end + shift);
      if (!range.decode(static_cast<std::uint64_t>(begin) * row_values,
                        static_cast<std::uint64_t>(stop) * row_values, slice)) {
        return;
      }
      HiddenStatesView view = hs;
      view.data = slice;
      view.tokens = stop - begin;
      if (hs.scales != nullptr) view.scales = hs.scales + static_cast<std::size_t>(begin) * 4;
      result.nonfinite +=
          copy_sample_rows(layout, batch, placement, view, global_row, noise, begin, end, begin);
    }
  });
  result.bad_chunk = range.bad_chunk;
  result.status = range.status;
  return result;
}

}  // namespace draftfeed
