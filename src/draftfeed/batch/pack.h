// Packing samples that a user's own preprocess returned (speculators' collate, docs/formats.md)
// into one batch row, natively.
//
// The engine hands each sample, validated, cast and noised, to the user's callable (it runs in
// Python, per sample); this packs what the callables returned, in one call. It follows the
// reference collate exactly, whatever keys, dtypes and row counts the callable produced:
//   * every key of the first sample but `lengths`, in its order, becomes a tensor
//     [1, max_len, *trailing shape of the first sample's], zero-filled: hidden-state keys (their
//     name contains "hidden_states") in the batch dtype, the others in the first sample's dtype;
//   * each key's rows are copied back to back, each sample's own row count for that key, until
//     max_len rows (the crossing sample truncated, later ones left out);
//   * `document_ids` [1, max_len] int64 from the samples' `lengths`: document k over its length
//     (the one reaching max_len cut there), then -1.
// Values of another dtype are converted as torch's copy does (floats to bf16 round to nearest even
// through float32; floats to integers truncate; anything to bool is `!= 0`).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

// A read-only tensor a callable returned: row-major, rows `stride0` bytes apart, each row's
// trailing dimensions contiguous.
struct TensorArg {
  const std::uint8_t* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;  // at least one dimension
  std::int64_t row_stride_bytes = 0;
};

struct SampleArg {
  std::vector<std::string> keys;  // in the sample's order
  std::vector<TensorArg> tensors;
  const TensorArg* find(const std::string& key) const;
};

struct PackedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;  // with the leading 1
  std::size_t offset = 0;           // bytes into the output buffer
  std::size_t nbytes = 0;
};

// What pack_samples produces: the output's tensors (document_ids last) and its size in bytes.
struct PackedLayout {
  std::vector<PackedTensor> tensors;
  std::size_t total_bytes = 0;
};

// Checks the samples against the collate's rules and lays out the output. Throws
// Error(kInvalidArgument) naming the sample and key: no samples, a missing key, a trailing shape
// that differs from the first sample's, a 0-d tensor, no `lengths`, an unsupported dtype.
PackedLayout layout_packed(const std::vector<SampleArg>& samples, std::int64_t max_len,
                           DType hidden_dtype);

// Writes the packed batch into `out` (layout.total_bytes, need not be zeroed).
void pack_samples(const std::vector<SampleArg>& samples, std::int64_t max_len,
                  const PackedLayout& layout, std::uint8_t* out);

}  // namespace draftfeed
