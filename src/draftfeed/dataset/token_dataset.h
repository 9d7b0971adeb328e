// The token dataset: a Hugging Face `save_to_disk` folder (docs/formats.md) read through memory
// maps.
//
// Rows are addressed by their *global* index (shards concatenated in `state.json` order). Row views
// point straight into the mapped Arrow buffers (zero copy) and keep the mapping alive.
// Thread safety: a TokenDataset is immutable after `open`; any number of threads may read it.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/mapped_file.h"

namespace draftfeed {

// A run of integers of any width (1, 2, 4 or 8 bytes, signed or not) inside a mapped file.
// The bytes may be unaligned, so elements are loaded with memcpy.
//
// A dataset row's values lie in its shard's mapping, which a process truncating the shard shrinks
// under the reader: a read of them then raises SIGBUS (common/fault_guard.h). So every read of a
// row's values runs under a fault guard: guarded_copy_to (one guard per row), or a guard the
// caller holds over many rows (the batch's integer tensors: one per batch), never the bare
// operator[] / copy_to / equals outside one. A fault is then an error naming the shard and the
// row (unreadable_row).
struct IntArrayView {
  const std::uint8_t* data = nullptr;
  std::int64_t length = 0;
  std::uint8_t byte_width = 8;
  bool is_signed = true;
  const std::string* shard = nullptr;  // the dataset shard holding the values, or null

  std::int64_t operator[](std::int64_t i) const;
  std::int64_t size() const { return length; }
  std::size_t size_bytes() const { return static_cast<std::size_t>(length) * byte_width; }
  // Widens every element into `out[0..length)`.
  void copy_to(std::int64_t* out) const;
  // copy_to under a fault guard: false when the values could not be read (the shard shrank).
  [[nodiscard]] bool guarded_copy_to(std::int64_t* out) const;
  // True when the elements equal `values` (lengths included).
  bool equals(std::span<const std::int64_t> values) const;
  // Whether `address` (a faulting one: last_guarded_fault_address) lies in these values.
  bool holds(const void* address) const;
};

// Error kIo for a row whose `column` values (`view`, of global row `row`; -1 when the caller names
// the row itself) could not be read: "<shard>: row R: its input_ids could not be read: the shard
// shrank under the reader (truncated or rewritten by another process)".
Error unreadable_row(const IntArrayView& view, std::int64_t row, const char* column);

// A column's name and its Arrow type as text, e.g. "list<int64>", "large_list<int32>", "int64".
struct ColumnInfo {
  std::string name;
  std::string type;
};

class TokenDataset {
 public:
  // Opens a `save_to_disk` folder. Throws Error naming the folder or shard and the problem: a
  // missing folder (kNotFound), a DatasetDict folder (kInvalidArgument, listing its splits), a
  // missing `input_ids` column, a corrupt or unsupported shard (kFormat / kUnsupported).
  static std::shared_ptr<const TokenDataset> open(const std::string& folder);

  const std::string& folder() const;
  std::int64_t num_rows() const;
  const std::vector<std::string>& shard_paths() const;
  const std::vector<ColumnInfo>& columns() const;
  bool has_column(const std::string& name) const;

  // Every row's length as int64: the `seq_len` column when present (the sampler's lengths, as the
  // reference reads them), else the length of each `input_ids` list. Copied out of the shards
  // once, at open (under the fault guard, as every read open makes of a mapped shard: a shard
  // truncated while it is opened is an error naming it, never a SIGBUS).
  std::span<const std::int64_t> seq_lens() const;

  // Sum of the lengths of all `input_ids` lists.
  std::int64_t total_tokens() const;

  // The row's token ids; throws Error(kInvalidArgument) for a row out of range. A view of the
  // mapped shard: read its values under a fault guard (see IntArrayView). Its bounds were copied
  // out of the shard at open, so the view itself is never a mapped read.
  IntArrayView input_ids(std::int64_t row) const;
  // The row's loss mask (column `loss_mask`); throws Error(kInvalidArgument) if there is no such
  // column.
  IntArrayView loss_mask(std::int64_t row) const;
  bool has_loss_mask() const;

  // True when the dataset has a `messages` column (multimodal conversations).
  bool has_messages() const;
  // The row's `messages` value as JSON text, shaped as `load_from_disk(folder)[row]["messages"]`
  // (see arrow_json.h). The column is checked lazily, here, so an odd `messages` column never
  // stops `open`. Errors (kInvalidArgument for a row out of range or no such column, kFormat /
  // kUnsupported for corrupt data or a type with no JSON form) name the shard and the row.
  Result<std::string> messages_json(std::int64_t row) const;

  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  struct Impl;

 private:
  explicit TokenDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A contiguous range of global rows: the train or val part of a dataset (docs/sampler.md).
struct DatasetSplit {
  std::shared_ptr<const TokenDataset> dataset;
  std::int64_t begin = 0;  // global index of the split's first row
  std::int64_t end = 0;    // one past the last

  std::int64_t num_rows() const { return end - begin; }
  std::int64_t global_row(std::int64_t local) const { return begin + local; }
  std::span<const std::int64_t> seq_lens() const {
    return dataset->seq_lens().subspan(static_cast<std::size_t>(begin),
                                       static_cast<std::size_t>(end - begin));
  }
};

// split = int(n * train_ratio); train = [0, split), val = [split, n). `train_ratio` must be in (0,
// 1) and both parts non-empty, else Error(kInvalidArgument) naming n, the ratio and the split
// index.
std::pair<DatasetSplit, DatasetSplit> split_train_val(std::shared_ptr<const TokenDataset> dataset,
                                                      double train_ratio);

}  // namespace draftfeed
