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
struct IntArrayView {
  const std::uint8_t* data = nullptr;
  std::int64_t length = 0;
  std::uint8_t byte_width = 8;
  bool is_signed = true;

  std::int64_t operator[](std::int64_t i) const;
  std::int64_t size() const { return length; }
  // Widens every element into `out[0..length)`.
  void copy_to(std::int64_t* out) const;
  // True when the elements equal `values` (lengths included).
  bool equals(std::span<const std::int64_t> values) const;
};

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
  // reference reads them), else the length of each `input_ids` list. Computed once at open.
  std::span<const std::int64_t> seq_lens() const;

  // Sum of the lengths of all `input_ids` lists.
  std::int64_t total_tokens() const;

  // The row's token ids; throws Error(kInvalidArgument) for a row out of range.
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
