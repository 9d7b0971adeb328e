#include "draftfeed/dataset/token_columns.h"

#include <cstring>
#include <optional>

#include "draftfeed/common/fault_guard.h"

namespace draftfeed {

namespace {

using arrow::ArrayView;
using arrow::Field;
using arrow::TypeId;

bool bit_set(std::span<const std::uint8_t> bitmap, std::int64_t i) {
  return (bitmap[static_cast<std::size_t>(i >> 3)] >> (i & 7)) & 1;
}

class ShardReader {
 public:
  ShardReader(const arrow::IpcStream& stream, const std::string& name, std::int64_t first_row,
              std::vector<std::int64_t>* seq_lens)
      : stream_(stream), name_(name), first_row_(first_row), seq_lens_(seq_lens) {}

  ShardColumns read() {
    const auto ids = find("input_ids");
    if (!ids) {
      std::string names;
      for (const auto& field : stream_.fields) names += (names.empty() ? "" : ", ") + field.name;
      throw Error(ErrorKind::kFormat,
                  name_ + ": no 'input_ids' column (columns: " + (names.empty() ? "none" : names) +
                      "); a training dataset needs token ids");
    }
    check_list_of_int(*ids);
    const auto mask = find("loss_mask");
    if (mask) check_list_of_int(*mask);
    const auto seq_len = find("seq_len");
    if (seq_len) check_int(*seq_len);

    ShardColumns out;
    out.has_loss_mask = mask.has_value();
    for (std::size_t b = 0; b < stream_.batches.size(); ++b) {
      const auto& batch = stream_.batches[b];
      batch_ = b;
      batch_first_row_ = first_row_ + out.rows;
      IntListChunk ids_chunk = list_chunk(*ids, batch.columns[*ids], batch.length);
      if (mask) out.loss_mask.push_back(list_chunk(*mask, batch.columns[*mask], batch.length));
      if (batch.length > 0) {
        out.total_tokens += ids_chunk.offset(batch.length) - ids_chunk.offset(0);
      }
      if (seq_len) {
        append_int_column(*seq_len, batch.columns[*seq_len], batch.length);
      } else {
        for (std::int64_t r = 0; r < batch.length; ++r) {
          seq_lens_->push_back(ids_chunk.offset(r + 1) - ids_chunk.offset(r));
        }
      }
      out.input_ids.push_back(std::move(ids_chunk));
      out.batch_rows.push_back(batch.length);
      out.rows += batch.length;
    }
    return out;
  }

 private:
  std::optional<std::size_t> find(const std::string& column) const {
    for (std::size_t i = 0; i < stream_.fields.size(); ++i) {
      if (stream_.fields[i].name == column) return i;
    }
    return std::nullopt;
  }

  void check_list_of_int(std::size_t index) const {
    const Field& field = stream_.fields[index];
    const bool list = field.type_id == TypeId::kList || field.type_id == TypeId::kLargeList;
    if (field.dictionary_encoded || !list || field.children[0].dictionary_encoded ||
        field.children[0].type_id != TypeId::kInt) {
      throw Error(ErrorKind::kUnsupported,
                  name_ + ": column '" + field.name + "' has type " + field.type +
                      "; draftfeed reads list<intN> or large_list<intN> (not dictionary-encoded)");
    }
  }

  void check_int(std::size_t index) const {
    const Field& field = stream_.fields[index];
    if (field.dictionary_encoded || field.type_id != TypeId::kInt) {
      throw Error(ErrorKind::kUnsupported,
                  name_ + ": column '" + field.name + "' has type " + field.type +
                      "; draftfeed reads an integer column (int8..int64, uint8..uint64)");
    }
  }

  std::string where(const Field& field) const {
    return name_ + ": record batch " + std::to_string(batch_) + ", column '" + field.name + "'";
  }

  [[noreturn]] void fail(const Field& field, const std::string& problem) const {
    throw Error(ErrorKind::kFormat, where(field) + ": " + problem);
  }

  // Runs `read` (plain loops over the mapped shard's bytes: no allocation, no throw) under the
  // fault guard; a shard truncated meanwhile (SIGBUS) is an error naming it and what was read.
  template <typename Read>
  void guarded(const Field& field, const char* what, Read&& read) const {
    if (!reads_.guard(read)) {
      throw Error(ErrorKind::kIo, where(field) + ": the shard shrank while its " +
                                      std::string(what) +
                                      " were read (truncated or rewritten by another process)");
    }
  }

  // Throws naming the first null row when `array` (one value per row) has nulls.
  void refuse_nulls(const Field& field, const ArrayView& array) const {
    if (array.null_count == 0) return;
    const auto& validity = array.buffers[0];
    const std::uint64_t needed = (static_cast<std::uint64_t>(array.length) + 7) / 8;
    if (validity.size() < needed) {
      fail(field, "claims " + std::to_string(array.null_count) +
                      " nulls but its validity bitmap is " + std::to_string(validity.size()) +
                      " bytes, less than the " + std::to_string(needed) + " its " +
                      std::to_string(array.length) + " rows need");
    }
    std::int64_t null_row = -1;
    guarded(field, "validity bitmap", [&] {
      for (std::int64_t r = 0; r < array.length && null_row < 0; ++r) {
        if (!bit_set(validity, r)) null_row = r;
      }
    });
    if (null_row >= 0) {
      throw Error(ErrorKind::kFormat, where(field) + ": row " +
                                          std::to_string(batch_first_row_ + null_row) +
                                          " is null; draftfeed needs a value in every row");
    }
    fail(field, "claims " + std::to_string(array.null_count) +
                    " nulls but its validity bitmap marks every row valid");
  }

  IntListChunk list_chunk(std::size_t index, const ArrayView& array, std::int64_t length) const {
    const Field& field = stream_.fields[index];
    const Field& child_field = field.children[0];
    refuse_nulls(field, array);
    IntListChunk chunk;
    chunk.offset_width = field.type_id == TypeId::kLargeList ? 8 : 4;
    chunk.value_width = static_cast<std::uint8_t>(child_field.bit_width / 8);
    chunk.value_signed = child_field.is_signed;
    const auto& offsets = array.buffers[1];
    const ArrayView& child = array.children[0];
    const auto& values = child.buffers[1];
    if (static_cast<std::uint64_t>(child.length) > values.size() / chunk.value_width) {
      fail(field, "claims " + std::to_string(child.length) + " values of " +
                      std::to_string(chunk.value_width) + " bytes but the values buffer is " +
                      std::to_string(values.size()) + " bytes");
    }
    chunk.values = values.data();
    if (length == 0) return chunk;
    if (static_cast<std::uint64_t>(length) >= offsets.size() / chunk.offset_width) {
      fail(field,
           "has " + std::to_string(length) + " rows but its offsets buffer is " +
               std::to_string(offsets.size()) + " bytes, less than the " +
               std::to_string((static_cast<std::uint64_t>(length) + 1) * chunk.offset_width) +
               " they need");
    }
    chunk.offsets.resize(static_cast<std::size_t>(length + 1) * chunk.offset_width);
    guarded(field, "offsets",
            [&] { std::memcpy(chunk.offsets.data(), offsets.data(), chunk.offsets.size()); });
    std::int64_t previous = chunk.offset(0);
    if (previous < 0) {
      fail(field, "the first offset is " + std::to_string(previous) + ", negative");
    }
    for (std::int64_t r = 0; r < length; ++r) {
      const std::int64_t next = chunk.offset(r + 1);
      if (next < previous) {
        fail(field, "offsets decrease at row " + std::to_string(batch_first_row_ + r) + " (" +
                        std::to_string(previous) + " then " + std::to_string(next) + ")");
      }
      previous = next;
    }
    if (previous > child.length) {
      fail(field, "the last offset " + std::to_string(previous) + " is past the " +
                      std::to_string(child.length) + " values of the list");
    }
    if (child.null_count > 0) refuse_null_tokens(field, child, chunk, length);
    return chunk;
  }

  void refuse_null_tokens(const Field& field, const ArrayView& child, const IntListChunk& chunk,
                          std::int64_t length) const {
    const auto& validity = child.buffers[0];
    const std::uint64_t needed = (static_cast<std::uint64_t>(child.length) + 7) / 8;
    if (validity.size() < needed) {
      fail(field, "claims " + std::to_string(child.null_count) +
                      " null values but its validity bitmap is " + std::to_string(validity.size()) +
                      " bytes, less than the " + std::to_string(needed) + " needed");
    }
    std::int64_t null_row = -1;
    std::int64_t null_at = 0;
    guarded(field, "values' validity bitmap", [&] {
      for (std::int64_t r = 0; r < length && null_row < 0; ++r) {
        for (std::int64_t i = chunk.offset(r); i < chunk.offset(r + 1); ++i) {
          if (!bit_set(validity, i)) {
            null_row = r;
            null_at = i - chunk.offset(r);
            break;
          }
        }
      }
    });
    if (null_row >= 0) {
      throw Error(ErrorKind::kFormat, where(field) + ": row " +
                                          std::to_string(batch_first_row_ + null_row) +
                                          " holds a null at position " + std::to_string(null_at) +
                                          "; draftfeed needs integer values");
    }
  }

  void append_int_column(std::size_t index, const ArrayView& array, std::int64_t length) const {
    const Field& field = stream_.fields[index];
    refuse_nulls(field, array);
    const auto width = static_cast<std::uint8_t>(field.bit_width / 8);
    const auto& values = array.buffers[1];
    if (static_cast<std::uint64_t>(length) > values.size() / width) {
      fail(field, "has " + std::to_string(length) + " rows of " + std::to_string(width) +
                      " bytes but its values buffer is " + std::to_string(values.size()) +
                      " bytes");
    }
    const IntArrayView view{values.data(), length, width, field.is_signed};
    const std::size_t start = seq_lens_->size();
    seq_lens_->resize(start + static_cast<std::size_t>(length));
    guarded(field, "values", [&] { view.copy_to(seq_lens_->data() + start); });
    for (std::int64_t r = 0; r < length; ++r) {
      const std::int64_t value = (*seq_lens_)[start + static_cast<std::size_t>(r)];
      if (value < 0) {
        fail(field, "row " + std::to_string(batch_first_row_ + r) + " has length " +
                        std::to_string(value) + ", negative");
      }
    }
  }

  const arrow::IpcStream& stream_;
  const std::string& name_;
  std::int64_t first_row_;
  std::vector<std::int64_t>* seq_lens_;
  std::size_t batch_ = 0;
  std::int64_t batch_first_row_ = 0;
  MappedReadScope reads_;  // the guards of every read of the stream's buffers
};

}  // namespace

Result<ShardColumns> read_token_columns(const arrow::IpcStream& stream, const std::string& name,
                                        std::int64_t first_row,
                                        std::vector<std::int64_t>* seq_lens) {
  try {
    return ShardReader(stream, name, first_row, seq_lens).read();
  } catch (const Error& error) {
    return error;
  }
}

std::vector<ColumnInfo> column_infos(const arrow::IpcStream& stream) {
  std::vector<ColumnInfo> columns;
  for (const auto& field : stream.fields) columns.push_back({field.name, field.type});
  return columns;
}

}  // namespace draftfeed
