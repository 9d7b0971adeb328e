#include "draftfeed/batch/assemble.h"

#include <algorithm>
#include <cstring>

#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/batch/noise.h"
#include "draftfeed/common/fault_guard.h"

namespace draftfeed {

namespace {

std::int64_t* int64_tensor(const BatchLayout& layout, const BatchMemory& batch, const char* name) {
  return reinterpret_cast<std::int64_t*>(slot_data(layout, batch, name));
}

// Source token of output row r, for the target layers and for the last layer.
std::int64_t shift_of(Preprocess preprocess) {
  return preprocess == Preprocess::kEagle3Shift ? 1 : 0;
}

}  // namespace

std::int64_t copy_row_lookahead(const BatchSpec& spec) { return shift_of(spec.preprocess); }

void set_target_noise(RowCopy& job, const BatchSpec& spec, const NoiseContext& noise,
                      std::int64_t global_row, std::int64_t first) {
  if (!noise.enabled || !spec.noise.enabled()) return;
  job.noise = spec.noise.kind;
  job.noise_std = static_cast<float>(spec.noise.std);
  job.noise_sample_key =
      noise_sample_key(spec.noise.seed, noise.epoch, static_cast<std::uint64_t>(global_row));
  job.first_token = first;
}

std::int64_t sample_rows_after_preprocess(Preprocess preprocess, std::int64_t tokens) {
  return preprocess == Preprocess::kEagle3Shift ? std::max<std::int64_t>(tokens - 1, 0) : tokens;
}

BatchPlacement place_samples(std::int64_t max_len, const std::vector<std::int64_t>& rows,
                             const std::vector<std::uint8_t>& usable) {
  BatchPlacement placement;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!usable[i]) continue;
    const std::int64_t take = std::min(rows[i], max_len - offset);
    placement.samples.push_back(SamplePlacement{i, offset, take});
    // The reference's lengths loop: a sample that reaches max_len ends the batch.
    if (rows[i] + offset >= max_len) {
      placement.documents.push_back(max_len - offset);
      offset = max_len;
      break;
    }
    placement.documents.push_back(rows[i]);
    offset += take;
  }
  placement.used_rows = offset;
  placement.locally_empty = placement.samples.empty();
  return placement;
}

BatchPlacement place_unpacked(const std::vector<std::int64_t>& rows,
                              const std::vector<std::uint8_t>& usable) {
  BatchPlacement placement;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!usable[i]) continue;
    placement.samples.push_back(SamplePlacement{i, placement.used_rows, rows[i]});
    placement.used_rows += rows[i];
  }
  placement.locally_empty = placement.samples.empty();
  return placement;
}

std::int64_t copy_sample_rows(const BatchLayout& layout, const BatchMemory& batch,
                              const SamplePlacement& placement, const HiddenStatesView& hs,
                              std::int64_t global_row, const NoiseContext& noise,
                              std::int64_t first, std::int64_t last, std::int64_t view_first) {
  const BatchSpec& spec = layout.spec;
  const std::int64_t rows = last - first;
  if (rows <= 0) return 0;
  const std::size_t src_elem = dtype_size(hs.dtype);
  const std::size_t dst_elem = dtype_size(spec.dtype);
  const std::int64_t src_stride = hs.layers * hs.hidden;
  const std::int64_t shift = shift_of(spec.preprocess);
  std::uint8_t* target = slot_data(layout, batch, "hidden_states");
  const std::int64_t dst_row = placement.dst_row + first;
  std::int64_t nonfinite = 0;

  auto source_at = [&](std::int64_t token, std::int64_t layer) {
    return hs.data +
           (static_cast<std::size_t>(token - view_first) * static_cast<std::size_t>(src_stride) +
            static_cast<std::size_t>(layer * hs.hidden)) *
               src_elem;
  };

  // FP8: the float32 scale of `token`, one per token.
  auto scale_at = [&](std::int64_t token) {
    return hs.scales == nullptr ? nullptr
                                : hs.scales + static_cast<std::size_t>(token - view_first) * 4;
  };

  RowCopy job;
  job.src_dtype = hs.dtype;
  job.src_row_stride = src_stride;
  job.dequantize = hs.dequantize;
  job.dst_dtype = spec.dtype;
  job.rows = rows;
  job.stores = batch_row_stores(layout.total_bytes);

  if (spec.preprocess == Preprocess::kMtp) {
    // MTP: `hidden_states` is the verifier's last layer, never noised.
    job.src = source_at(first, hs.layers - 1);
    job.src_scales = scale_at(first);
    job.width = hs.hidden;
    job.dst_row_stride = job.width;
    job.dst = target + static_cast<std::size_t>(dst_row * job.width) * dst_elem;
    return copy_hidden_rows(job);
  }

  // Target layers 0..L-2 of token t are contiguous: one row of (L-1)*H elements.
  job.src = source_at(first, 0);
  job.src_scales = scale_at(first);
  job.width = (hs.layers - 1) * hs.hidden;
  job.dst_row_stride = job.width;
  job.dst = target + static_cast<std::size_t>(dst_row * job.width) * dst_elem;
  set_target_noise(job, spec, noise, global_row, first);
  nonfinite += copy_hidden_rows(job);

  // The verifier's last layer, shifted by one token under EAGLE-3.
  RowCopy last_job;
  last_job.stores = job.stores;
  last_job.src_dtype = hs.dtype;
  last_job.src_row_stride = src_stride;
  last_job.dequantize = hs.dequantize;
  last_job.dst_dtype = spec.dtype;
  last_job.rows = rows;
  last_job.src = source_at(first + shift, hs.layers - 1);
  last_job.src_scales = scale_at(first + shift);
  last_job.width = hs.hidden;
  last_job.dst_row_stride = hs.hidden;
  last_job.dst = slot_data(layout, batch, "verifier_last_hidden_states") +
                 static_cast<std::size_t>(dst_row * hs.hidden) * dst_elem;
  nonfinite += copy_hidden_rows(last_job);
  return nonfinite;
}

std::optional<UnreadableSample> finish_batch(const BatchLayout& layout, const BatchMemory& batch,
                                             const BatchPlacement& placement,
                                             const std::vector<IntArrayView>& ids,
                                             const std::vector<IntArrayView>& masks) {
  const std::int64_t max_len = layout.spec.max_len;
  const std::int64_t shift = shift_of(layout.spec.preprocess);
  std::int64_t* input_ids = int64_tensor(layout, batch, "input_ids");
  std::int64_t* loss_mask = int64_tensor(layout, batch, "loss_mask");
  std::int64_t* position_ids = int64_tensor(layout, batch, "position_ids");
  std::int64_t* document_ids = int64_tensor(layout, batch, "document_ids");

  // Plain loops over the mapped rows (no allocation, no lock, no throw): fit for the guard.
  const auto write_sample = [&](const SamplePlacement& p) {
    const IntArrayView& id_view = ids[p.sample];
    const IntArrayView& mask_view = masks[p.sample];
    for (std::int64_t r = 0; r < p.rows; ++r) {
      input_ids[p.dst_row + r] = id_view[r + shift];
      loss_mask[p.dst_row + r] = mask_view[r + shift];
      position_ids[p.dst_row + r] = r + shift;
    }
  };
  const bool written = guard_mapped_reads([&] {
    for (const SamplePlacement& p : placement.samples) write_sample(p);
  });
  if (!written) {
    // Rare: find the sample whose shard shrank, one guard per sample. If none faults now, every
    // sample has been written after all.
    for (std::size_t k = 0; k < placement.samples.size(); ++k) {
      const SamplePlacement& p = placement.samples[k];
      if (guard_mapped_reads([&] { write_sample(p); })) continue;
      const bool in_ids = ids[p.sample].holds(last_guarded_fault_address());
      return UnreadableSample{k, in_ids ? "input_ids" : "loss_mask"};
    }
  }
  if (layout.spec.preprocess == Preprocess::kCustom) return std::nullopt;  // samples only
  std::int64_t row = 0;
  for (std::size_t doc = 0; doc < placement.documents.size(); ++doc) {
    std::fill_n(document_ids + row, placement.documents[doc], static_cast<std::int64_t>(doc));
    row += placement.documents[doc];
  }
  const std::int64_t used = placement.used_rows;
  std::fill(document_ids + row, document_ids + max_len, -1);
  std::fill(input_ids + used, input_ids + max_len, 0);
  std::fill(loss_mask + used, loss_mask + max_len, 0);
  std::fill(position_ids + used, position_ids + max_len, 0);
  // Zero the padding rows of the hidden-state tensors (the buffer is reused across batches).
  for (std::size_t s = 0; s < layout.tensors.size(); ++s) {
    const TensorSlot& slot = layout.tensors[s];
    if (slot.dtype == DType::kI64) continue;
    const std::size_t row_bytes = slot.nbytes / static_cast<std::size_t>(max_len);
    std::memset(batch[s] + static_cast<std::size_t>(used) * row_bytes, 0,
                static_cast<std::size_t>(max_len - used) * row_bytes);
  }
  return std::nullopt;
}

}  // namespace draftfeed
