#include "draftfeed/batch/file_rows_copy.h"

#include <sys/uio.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "draftfeed/batch/thread_buffer.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/finite.h"
#include "draftfeed/common/mapped_file.h"

namespace draftfeed {

namespace {

thread_local ThreadBuffer staging;  // slices to be cast or dequantized
thread_local ThreadBuffer sink;     // bytes a vectored read must pass over

// Reads `length` bytes at `offset` of `file` into `out`; false when fewer came (or an error).
bool read_whole(const MappedFile& file, std::size_t offset, std::size_t length, std::uint8_t* out) {
  if (length == 0) return true;
  auto got = file.read_at(offset, length, out);
  return got.ok() && got.value() == length;
}

// NaN/Inf among `count` elements at `data` (the fast scan first: they are rare).
std::int64_t count_nonfinite(const std::uint8_t* data, std::int64_t count, DType dtype) {
  if (all_finite(data, static_cast<std::size_t>(count), dtype)) return 0;
  NonFiniteCounts counts;
  count_nonfinite_per_slot(data, 1, 1, count, dtype, std::span<NonFiniteCounts>(&counts, 1));
  return counts.total();
}

// Where the rows of one sample go and come from.
struct Rows {
  const MappedFile* file;
  const HiddenStatesView* hs;
  std::size_t elem;         // bytes per element
  std::size_t row_bytes;    // one token in the file: L x H
  std::size_t data_offset;  // the file offset of token 0
  std::int64_t shift;       // the EAGLE-3 shift: the last layer of token t goes to row t - shift
};

// Straight into the batch only when the bytes go there unchanged: a noised slice is read into the
// staging buffer and noised on its way out (one pass writing the batch with streaming stores); read
// into the batch and noised there, the batch's lines are fetched from memory before the read
// overwrites them, and passed over twice (docs/decisions.md has the cost of each).
bool reads_into_batch(const BatchSpec& spec, const HiddenStatesView& hs,
                      const NoiseContext& noise) {
  return spec.dtype == hs.dtype && hs.scales == nullptr && spec.preprocess != Preprocess::kMtp &&
         hs.layers >= 2 && !(noise.enabled && spec.noise.enabled());
}

// Rows [begin, end) of the sample read straight into the batch; returns false if unreadable.
bool read_slice_into_batch(const Rows& rows, std::uint8_t* target, std::uint8_t* last_target,
                           std::int64_t dst_row, std::int64_t begin, std::int64_t end,
                           std::vector<iovec>& parts) {
  const HiddenStatesView& hs = *rows.hs;
  const auto last_bytes = static_cast<std::size_t>(hs.hidden) * rows.elem;
  const std::size_t target_bytes = rows.row_bytes - last_bytes;
  // Tokens [begin, end + shift) in file order, each [target layers][last layer]: the target
  // layers of tokens before `end` and the last layers of tokens from `begin + shift` on go to
  // their batch rows; the rest (the first token's last layer and the last token's target layers
  // under the shift: the neighbouring slices' rows) to a sink.
  const std::int64_t stop = std::min(hs.tokens, end + rows.shift);
  std::uint8_t* scrap = sink.at_least(target_bytes);
  parts.clear();
  for (std::int64_t t = begin; t < stop; ++t) {
    std::uint8_t* to_target =
        t < end ? target + static_cast<std::size_t>(dst_row + t) * target_bytes : scrap;
    std::uint8_t* to_last =
        t - rows.shift >= begin
            ? last_target + static_cast<std::size_t>(dst_row + t - rows.shift) * last_bytes
            : scrap;
    parts.push_back({to_target, target_bytes});
    parts.push_back({to_last, last_bytes});
  }
  std::size_t want = 0;
  for (const iovec& part : parts) want += part.iov_len;
  auto got = rows.file->read_at(rows.data_offset + static_cast<std::size_t>(begin) * rows.row_bytes,
                                std::span<iovec>(parts));
  return got.ok() && got.value() == want;
}

FileRowsCopy copy_into_batch(const BatchLayout& layout, const BatchMemory& batch,
                             const SamplePlacement& placement, const Rows& rows, std::int64_t first,
                             std::int64_t last) {
  const HiddenStatesView& hs = *rows.hs;
  const std::int64_t width = (hs.layers - 1) * hs.hidden;
  std::uint8_t* target = slot_data(layout, batch, "hidden_states");
  std::uint8_t* last_target = slot_data(layout, batch, "verifier_last_hidden_states");
  // At most IOV_MAX parts, two per token.
  const std::int64_t slice_rows = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kSliceBytes / rows.row_bytes), 1, IOV_MAX / 2 - rows.shift);
  thread_local std::vector<iovec> parts;
  FileRowsCopy result;
  for (std::int64_t begin = first; begin < last; begin += slice_rows) {
    const std::int64_t end = std::min(last, begin + slice_rows);
    if (!read_slice_into_batch(rows, target, last_target, placement.dst_row, begin, end, parts)) {
      result.unreadable = true;
      return result;
    }
    // The slice is in cache now: check it there.
    const std::uint8_t* slice =
        target + static_cast<std::size_t>((placement.dst_row + begin) * width) * rows.elem;
    result.nonfinite += count_nonfinite(slice, (end - begin) * width, hs.dtype);
    result.nonfinite += count_nonfinite(
        last_target + static_cast<std::size_t>((placement.dst_row + begin) * hs.hidden) * rows.elem,
        (end - begin) * hs.hidden, hs.dtype);
  }
  return result;
}

FileRowsCopy copy_through_staging(const BatchLayout& layout, const BatchMemory& batch,
                                  const SamplePlacement& placement, const Rows& rows,
                                  std::int64_t global_row, const NoiseContext& noise,
                                  std::int64_t first, std::int64_t last) {
  const HiddenStatesView& hs = *rows.hs;
  const auto last_bytes = static_cast<std::size_t>(hs.hidden) * rows.elem;
  const std::size_t last_at = rows.row_bytes - last_bytes;
  const std::size_t scales_offset =
      hs.scales == nullptr ? 0 : static_cast<std::size_t>(hs.scales - rows.file->data());
  const std::int64_t slice_rows =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(kSliceBytes / rows.row_bytes));
  // Room for a slice, the last layer of the rows after it (the EAGLE-3 shift) and its scales.
  std::uint8_t* stage =
      staging.at_least(static_cast<std::size_t>(slice_rows + rows.shift) * (rows.row_bytes + 4));
  FileRowsCopy result;
  for (std::int64_t begin = first; begin < last; begin += slice_rows) {
    const std::int64_t end = std::min(last, begin + slice_rows);
    const std::int64_t extra = std::min(rows.shift, hs.tokens - end);
    const auto count = static_cast<std::size_t>(end - begin);
    bool ok =
        read_whole(*rows.file, rows.data_offset + static_cast<std::size_t>(begin) * rows.row_bytes,
                   count * rows.row_bytes, stage);
    for (std::int64_t k = 0; ok && k < extra; ++k) {
      const std::size_t row = count + static_cast<std::size_t>(k);
      ok = read_whole(
          *rows.file,
          rows.data_offset + static_cast<std::size_t>(end + k) * rows.row_bytes + last_at,
          last_bytes, stage + row * rows.row_bytes + last_at);
    }
    HiddenStatesView view = hs;
    view.data = stage;
    view.tokens = end - begin + extra;
    if (ok && hs.scales != nullptr) {
      std::uint8_t* scales = stage + static_cast<std::size_t>(view.tokens) * rows.row_bytes;
      ok = read_whole(*rows.file, scales_offset + static_cast<std::size_t>(begin) * 4,
                      static_cast<std::size_t>(view.tokens) * 4, scales);
      view.scales = scales;
    }
    if (!ok) {
      result.unreadable = true;
      return result;
    }
    result.nonfinite +=
        copy_sample_rows(layout, batch, placement, view, global_row, noise, begin, end, begin);
  }
  return result;
}

}  // namespace

bool can_read_file_rows(const FetchedSample& sample) {
  return sample.read_rows && sample.file && sample.file->fd() >= 0 && sample.hidden.data != nullptr;
}

FileRowsCopy copy_file_rows(const BatchLayout& layout, const BatchMemory& batch,
                            const SamplePlacement& placement, const FetchedSample& sample,
                            std::int64_t global_row, const NoiseContext& noise, std::int64_t first,
                            std::int64_t last) {
  const HiddenStatesView& hs = sample.hidden;
  Rows rows;
  rows.file = sample.file.get();
  rows.hs = &hs;
  rows.elem = dtype_size(hs.dtype);
  rows.row_bytes =
      std::max<std::size_t>(1, static_cast<std::size_t>(hs.layers * hs.hidden) * rows.elem);
  rows.data_offset = static_cast<std::size_t>(hs.data - sample.file->data());
  rows.shift = copy_row_lookahead(layout.spec);
  if (reads_into_batch(layout.spec, hs, noise)) {
    return copy_into_batch(layout, batch, placement, rows, first, last);
  }
  return copy_through_staging(layout, batch, placement, rows, global_row, noise, first, last);
}

}  // namespace draftfeed
