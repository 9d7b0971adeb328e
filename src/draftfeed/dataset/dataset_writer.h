// Writes a token dataset as a Hugging Face `save_to_disk` folder, streaming: rows go to disk in
// record batches as they are added, so memory stays at one batch.
//
// Output (loads with `datasets.load_from_disk`, rows identical, torch format like speculators'
// preprocessing saves it):
//   data-0000K-of-0000N.arrow   Arrow IPC stream shards; record batches of `rows_per_batch` rows
//   state.json                  `_data_files` in row order, `"_format_type": "torch"`
//   dataset_info.json           the features: input_ids List(int64|int32), loss_mask
//                               List(int64), seq_len Value(int64)
// Columns: input_ids list<int64> (list<int32> with `input_ids_int32`), loss_mask list<int64>,
// seq_len int64 (= len(input_ids)).
// Shards are written under temporary names and renamed by finish(), which first removes the
// dataset files of an earlier dataset in the folder; a folder holding anything else is refused.
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace draftfeed {

struct DatasetWriterOptions {
  bool input_ids_int32 = false;        // list<int32> token ids (values must fit)
  std::int64_t rows_per_batch = 1000;  // datasets' default writer batch size
  // Shard count. 0: cut a new shard when one passes `max_shard_bytes` (at a batch boundary).
  // > 0: exactly this many shards of contiguous rows, the first (rows % shards) one row longer,
  // as datasets' `save_to_disk(num_shards=...)` splits them; needs `total_rows`.
  std::int64_t num_shards = 0;
  std::int64_t total_rows = -1;  // rows that will be added (-1: unknown); checked by finish()
  std::int64_t max_shard_bytes = 500LL << 20;  // datasets' default max_shard_size, "500MB"
  std::string format_type = "torch";           // state.json `_format_type` ("" writes null)
};

struct DatasetWriteSummary {
  std::int64_t rows = 0;
  std::int64_t tokens = 0;
  std::vector<std::string> shard_paths;
  std::uint64_t bytes = 0;  // all shards
};

// Each field under its reported name (common/stats_tree.h): what the Python writer returns.
template <typename Visit>
void for_each_stat(const DatasetWriteSummary& s, Visit&& visit) {
  visit("rows", s.rows);
  visit("tokens", s.tokens);
  visit("shards", s.shard_paths);
  visit("bytes", s.bytes);
}

class DatasetWriter {
 public:
  // Creates `folder` if needed. Throws Error(kInvalidArgument) for bad options or a folder that
  // holds files other than an earlier dataset's.
  explicit DatasetWriter(const std::string& folder, DatasetWriterOptions options = {});
  ~DatasetWriter();  // without finish(): removes the temporary shards
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Adds one row. `loss_mask` must have the same length as `input_ids` (Error kInvalidArgument
  // naming the row and both lengths); with `input_ids_int32`, ids must fit in int32.
  void add_row(std::span<const std::int64_t> input_ids, std::span<const std::int64_t> loss_mask);

  // Writes the last batch, the end-of-stream markers, state.json and dataset_info.json, and
  // renames the shards into place. Throws if `total_rows` was given and differs from the rows
  // added.
  DatasetWriteSummary finish();

  std::int64_t rows() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace draftfeed
