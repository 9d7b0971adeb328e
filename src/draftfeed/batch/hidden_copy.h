// The one copy: hidden-state rows from a mapped file into a batch tensor, with the dtype cast, the
// training noise and the finiteness check fused into a single pass over the bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/vector_store.h"

namespace draftfeed {

struct RowCopy {
  const std::uint8_t* src = nullptr;  // first element of the first row to copy
  DType src_dtype = DType::kBF16;
  std::int64_t src_row_stride = 0;  // elements between consecutive rows (L * H)
  // F8 E4M3 sources: the float32 scale of the first row's token (one per row, consecutive, any
  // alignment), and the dtype the values are dequantized in (fp8_dequantize.h) before the cast.
  const std::uint8_t* src_scales = nullptr;
  DType dequantize = DType::kBF16;
  std::uint8_t* dst = nullptr;
  DType dst_dtype = DType::kBF16;   // bf16 or f32
  std::int64_t dst_row_stride = 0;  // elements
  std::int64_t rows = 0;
  std::int64_t width = 0;  // elements per row

  // Noise (kind kNone for the verifier's last layer and for validation batches).
  NoiseKind noise = NoiseKind::kNone;
  float noise_std = 0.0f;
  std::uint64_t noise_sample_key = 0;
  std::int64_t first_token = 0;  // the file's token index of the first row (the noise counter)

  // How the kernels write the rows (vector_store.h): streamed for a batch too large to stay in
  // cache (batch_row_stores), ordinary stores otherwise.
  RowStores stores = RowStores::kCached;
};

// Batches of at least this many bytes are written with streaming stores: far larger than the
// caches of the machines a loader runs on (a trainer reads them from memory anyway), while the
// small batches of small models stay in cache for their reader.
inline constexpr std::size_t kStreamedBatchBytes = std::size_t{32} << 20;

inline RowStores batch_row_stores(std::size_t batch_bytes) {
  return batch_bytes >= kStreamedBatchBytes ? RowStores::kStreamed : RowStores::kCached;
}

// Copies and returns the number of non-finite source elements (NaN or Inf) seen; for an FP8
// source, of non-finite dequantized values (NaN codes, and products too large for the dequantize
// dtype). bf16 rounding is round-to-nearest-even, as PyTorch's float -> bfloat16 cast. Noise is
// added to the value as the file gives it (after dequantizing), in float32, rounded once.
std::int64_t copy_hidden_rows(const RowCopy& job);

}  // namespace draftfeed
