// The columns draftfeed reads from one shard, validated once so that row access needs no checks.
//
// `input_ids` (required) and `loss_mask` (optional) must be list<intN> or large_list<intN>;
// `seq_len` (optional) must be an integer column. None of them may be dictionary-encoded or hold
// nulls. Every other column is skipped and only reported by name and type.
// Validated per record batch: offsets non-negative, non-decreasing and inside the values array
// (the first need not be 0), values and offsets buffers long enough, no null row, no null token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/int_load.h"
#include "draftfeed/dataset/arrow_ipc.h"
#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {

// One record batch's share of a list-of-integers column. Its offsets are copied out of the shard
// (under the fault guard) when it is read: a row's bounds are then never a mapped read, and were
// checked once; only the values stay in the mapping (a few bytes per row copied, against the
// row's values left where they are).
struct IntListChunk {
  std::vector<std::uint8_t> offsets;  // length + 1 entries (none when the batch is empty)
  std::uint8_t offset_width = 4;      // 4 for list, 8 for large_list
  const std::uint8_t* values = nullptr;
  std::uint8_t value_width = 8;
  bool value_signed = true;
  const std::string* shard = nullptr;  // set by the dataset once its shard list is final

  std::int64_t offset(std::int64_t i) const {
    return load_int(offsets.data() + i * offset_width, offset_width, true);
  }
  IntArrayView row(std::int64_t local) const {
    const std::int64_t begin = offset(local);
    return IntArrayView{values + begin * value_width, offset(local + 1) - begin, value_width,
                        value_signed, shard};
  }
};

struct ShardColumns {
  std::vector<std::int64_t> batch_rows;  // rows in each record batch
  std::vector<IntListChunk> input_ids;   // one per record batch
  std::vector<IntListChunk> loss_mask;   // one per record batch, or empty without the column
  bool has_loss_mask = false;
  std::int64_t rows = 0;
  std::int64_t total_tokens = 0;
};

// Validates and indexes the shard's token columns and appends each row's length to `seq_lens`
// (the `seq_len` column when present, else the input_ids list lengths). `name` (the shard's path)
// and `first_row` (global index of its first row) make error messages name the file and the row.
// Every read of the stream's buffers (offsets, validity bitmaps, seq_len values) runs under the
// fault guard. Errors: kFormat (missing input_ids, corrupt offsets, nulls), kUnsupported (wrong
// column types, dictionary encoding), kIo (the mapped shard shrank while it was read).
Result<ShardColumns> read_token_columns(const arrow::IpcStream& stream, const std::string& name,
                                        std::int64_t first_row,
                                        std::vector<std::int64_t>* seq_lens);

// Every top-level column's name and type text.
std::vector<ColumnInfo> column_infos(const arrow::IpcStream& stream);

}  // namespace draftfeed
