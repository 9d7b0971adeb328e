#include "draftfeed/dataset/token_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>

#include "draftfeed/common/control_file.h"
#include "draftfeed/common/held_file.h"
#include "draftfeed/dataset/arrow_ipc.h"
#include "draftfeed/dataset/arrow_json.h"
#include "draftfeed/dataset/dataset_state.h"
#include "draftfeed/dataset/feature_types.h"
#include "draftfeed/dataset/token_columns.h"

namespace draftfeed {

namespace fs = std::filesystem;

struct TokenDataset::Impl {
  std::string folder;
  std::vector<std::string> shard_paths;
  std::vector<ColumnInfo> columns;
  std::vector<std::shared_ptr<const MappedFile>> files;  // keep every view's bytes mapped
  // Global index of each record batch's first row, then num_rows as a sentinel.
  std::vector<std::int64_t> batch_starts;
  std::vector<IntListChunk> input_ids;
  std::vector<IntListChunk> loss_mask;
  bool has_loss_mask = true;
  std::vector<std::int64_t> seq_lens;
  std::vector<std::size_t> batch_shard;  // index into shard_paths of each record batch
  // The `messages` column, when there is one: its field and each record batch's array, whose
  // spans point into `files`. Kept as parsed, unchecked: messages_json checks what a row reaches.
  std::optional<arrow::Field> messages_field;
  std::vector<arrow::ArrayView> messages;  // one per record batch
  std::int64_t num_rows = 0;
  std::int64_t total_tokens = 0;

  std::size_t batch_of(std::int64_t row, const char* what) const {
    if (row < 0 || row >= num_rows) {
      throw Error(ErrorKind::kInvalidArgument,
                  folder + ": " + what + " of row " + std::to_string(row) + " requested, but the " +
                      "dataset has " + std::to_string(num_rows) + " rows");
    }
    const auto it = std::upper_bound(batch_starts.begin(), batch_starts.end(), row);
    return static_cast<std::size_t>(it - batch_starts.begin() - 1);
  }
};

namespace {

using Json = nlohmann::ordered_json;  // keeps the files' key order (column order)

constexpr const char* kMessagesColumn = "messages";

// A dataset folder's JSON files, read by name from a folder anything may have changed: bounded
// (state.json lists a few dozen bytes per shard; dataset_info.json holds the features and a
// description), never blocking on a FIFO, a regular file only (common/control_file.h). Links are
// followed: a Hugging Face hub snapshot's files are links into its blob store.
constexpr std::uint64_t kMaxDatasetJsonBytes = std::uint64_t{64} << 20;

// The folder's files are opened relative to its descriptor: a folder renamed or replaced while it
// is opened does not mix two datasets.
struct OpenFolder {
  UniqueFd fd;
  fs::path path;

  bool has(const char* name) const {
    struct stat st {};
    return ::fstatat(fd.get(), name, &st, AT_SYMLINK_NOFOLLOW) == 0;
  }
  std::string read_text(const char* name, const char* what) const {
    const ControlFileRules rules{kMaxDatasetJsonBytes, what, ControlFileLinks::kFollow};
    return read_control_file_at(fd.get(), path.string(), name, rules).value().bytes;
  }
  Json read_json(const char* name, const char* what) const {
    return parse_dataset_json(read_text(name, what), (path / name).string());
  }
  std::shared_ptr<const MappedFile> map(const std::string& name) const {
    // O_NONBLOCK: a FIFO under a shard's name must not block the open (map_descriptor refuses it).
    const int shard =
        ::openat(fd.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    const std::string shown = (path / name).string();
    if (shard < 0) {
      const int err = errno;
      throw Error(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kIo,
                  shown + ": cannot open: " + os_error_text(err));
    }
    return MappedFile::map_descriptor(shard, shown).value();
  }
};

// A dataset with no shards (datasets 5 saves 0 rows that way): its columns come from
// dataset_info.json, and it must still be a token dataset.
std::vector<ColumnInfo> columns_without_shards(const OpenFolder& folder) {
  const fs::path info_path = folder.path / "dataset_info.json";
  if (!folder.has("dataset_info.json")) {
    throw Error(ErrorKind::kFormat, (folder.path / "state.json").string() +
                                        " lists no shards and there is no dataset_info.json to "
                                        "say which columns the (empty) dataset has");
  }
  const Json info = folder.read_json("dataset_info.json", "a dataset's dataset_info.json");
  auto columns = columns_from_features(info.contains("features") ? info["features"] : Json());
  const auto ids = std::find_if(columns.begin(), columns.end(),
                                [](const ColumnInfo& c) { return c.name == "input_ids"; });
  if (ids == columns.end()) {
    throw Error(ErrorKind::kFormat, info_path.string() +
                                        ": no 'input_ids' feature in this empty dataset; a "
                                        "training dataset needs token ids");
  }
  return columns;
}

[[noreturn]] void refuse_dataset_dict(const OpenFolder& folder) {
  std::string splits;
  try {
    const Json dict = folder.read_json("dataset_dict.json", "a DatasetDict's dataset_dict.json");
    if (dict.contains("splits") && dict["splits"].is_array()) {
      for (const auto& split : dict["splits"]) {
        if (!split.is_string()) continue;
        splits += (splits.empty() ? "" : ", ") + split.get<std::string>();
      }
    }
  } catch (const Error&) {
    // The message below is still the useful one.
  }
  const std::string example =
      (folder.path / (splits.empty() ? std::string("<split>") : splits.substr(0, splits.find(','))))
          .string();
  throw Error(ErrorKind::kInvalidArgument,
              folder.path.string() + " is a DatasetDict with splits [" + splits +
                  "], not a single dataset; pass one split's folder, e.g. " + example);
}

bool same_columns(const std::vector<ColumnInfo>& a, const std::vector<ColumnInfo>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const ColumnInfo& x, const ColumnInfo& y) {
                      return x.name == y.name && x.type == y.type;
                    });
}

std::string describe(const std::vector<ColumnInfo>& columns) {
  std::string text;
  for (const auto& column : columns) {
    text += (text.empty() ? "" : ", ") + column.name + ": " + column.type;
  }
  return "{" + text + "}";
}

// Keeps the `messages` column's field and per-batch arrays (copies of the small view trees, no data
// walked). Shards have the same column names and types, so every shard has it or none does.
void keep_messages_column(arrow::IpcStream& stream, TokenDataset::Impl* impl) {
  for (std::size_t c = 0; c < stream.fields.size(); ++c) {
    if (stream.fields[c].name != kMessagesColumn) continue;
    if (!impl->messages_field) impl->messages_field = stream.fields[c];
    for (auto& batch : stream.batches) impl->messages.push_back(std::move(batch.columns[c]));
    return;
  }
}

}  // namespace

std::shared_ptr<const TokenDataset> TokenDataset::open(const std::string& folder_arg) {
  const fs::path folder(folder_arg);
  std::error_code ec;
  const auto status = fs::status(folder, ec);
  if (!fs::exists(status)) {
    throw Error(ErrorKind::kNotFound, "dataset folder " + folder_arg + " does not exist");
  }
  if (!fs::is_directory(status)) {
    throw Error(ErrorKind::kInvalidArgument,
                folder_arg + " is a file; pass the folder that Dataset.save_to_disk wrote");
  }
  const OpenFolder opened{open_folder(folder_arg).value(), folder};
  if (opened.has("dataset_dict.json")) refuse_dataset_dict(opened);
  std::vector<std::string> names;
  if (opened.has("state.json")) {
    names = shard_names_from_state_json(opened.read_text("state.json", "a dataset's state.json"),
                                        (folder / "state.json").string());
  } else if (opened.has("dataset.arrow")) {
    names = {"dataset.arrow"};  // the single-file layout of datasets before 2.8
  } else {
    throw Error(ErrorKind::kNotFound,
                folder_arg +
                    " holds neither state.json nor dataset.arrow: not a folder written "
                    "by Dataset.save_to_disk");
  }

  auto impl = std::make_unique<Impl>();
  impl->folder = folder_arg;
  for (const auto& name : names) {
    const std::string path = (folder / name).string();
    auto file = opened.map(name);
    auto stream = arrow::read_ipc_stream(file->bytes(), path).value();
    auto columns = column_infos(stream);
    if (impl->shard_paths.empty()) {
      impl->columns = columns;
    } else if (!same_columns(columns, impl->columns)) {
      throw Error(ErrorKind::kFormat, path + " has columns " + describe(columns) + " but " +
                                          impl->shard_paths.front() + " has " +
                                          describe(impl->columns));
    }
    ShardColumns shard = read_token_columns(stream, path, impl->num_rows, &impl->seq_lens).value();
    for (const auto rows : shard.batch_rows) {
      impl->batch_starts.push_back(impl->num_rows);
      impl->batch_shard.push_back(impl->shard_paths.size());
      impl->num_rows += rows;
    }
    keep_messages_column(stream, impl.get());
    impl->input_ids.insert(impl->input_ids.end(), std::make_move_iterator(shard.input_ids.begin()),
                           std::make_move_iterator(shard.input_ids.end()));
    impl->loss_mask.insert(impl->loss_mask.end(), std::make_move_iterator(shard.loss_mask.begin()),
                           std::make_move_iterator(shard.loss_mask.end()));
    impl->has_loss_mask = shard.has_loss_mask;
    impl->total_tokens += shard.total_tokens;
    impl->shard_paths.push_back(path);
    impl->files.push_back(std::move(file));
  }
  if (names.empty()) {
    impl->columns = columns_without_shards(opened);
    impl->has_loss_mask = std::any_of(impl->columns.begin(), impl->columns.end(),
                                      [](const ColumnInfo& c) { return c.name == "loss_mask"; });
  }
  impl->batch_starts.push_back(impl->num_rows);
  // Row views name their shard in messages; the list of shards is final now.
  for (std::size_t b = 0; b < impl->input_ids.size(); ++b) {
    const std::string* shard = &impl->shard_paths[impl->batch_shard[b]];
    impl->input_ids[b].shard = shard;
    if (b < impl->loss_mask.size()) impl->loss_mask[b].shard = shard;
  }
  return std::shared_ptr<const TokenDataset>(new TokenDataset(std::move(impl)));
}

TokenDataset::TokenDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDataset::~TokenDataset() = default;

const std::string& TokenDataset::folder() const { return impl_->folder; }
std::int64_t TokenDataset::num_rows() const { return impl_->num_rows; }
const std::vector<std::string>& TokenDataset::shard_paths() const { return impl_->shard_paths; }
const std::vector<ColumnInfo>& TokenDataset::columns() const { return impl_->columns; }
bool TokenDataset::has_column(const std::string& name) const {
  return std::any_of(impl_->columns.begin(), impl_->columns.end(),
                     [&](const ColumnInfo& column) { return column.name == name; });
}
std::span<const std::int64_t> TokenDataset::seq_lens() const { return impl_->seq_lens; }
std::int64_t TokenDataset::total_tokens() const { return impl_->total_tokens; }
bool TokenDataset::has_loss_mask() const { return impl_->has_loss_mask; }

IntArrayView TokenDataset::input_ids(std::int64_t row) const {
  const std::size_t batch = impl_->batch_of(row, "input_ids");
  return impl_->input_ids[batch].row(row - impl_->batch_starts[batch]);
}

IntArrayView TokenDataset::loss_mask(std::int64_t row) const {
  if (!impl_->has_loss_mask) {
    throw Error(ErrorKind::kInvalidArgument,
                impl_->folder + ": the dataset has no 'loss_mask' column (columns: " +
                    describe(impl_->columns) + ")");
  }
  const std::size_t batch = impl_->batch_of(row, "loss_mask");
  return impl_->loss_mask[batch].row(row - impl_->batch_starts[batch]);
}

// From the column list, so a 0-row dataset (no shards, columns from dataset_info.json) answers too.
bool TokenDataset::has_messages() const { return has_column(kMessagesColumn); }

Result<std::string> TokenDataset::messages_json(std::int64_t row) const {
  if (!has_messages()) {
    return Error(
        ErrorKind::kInvalidArgument,
        impl_->folder + ": row " + std::to_string(row) +
            ": the dataset has no 'messages' column (columns: " + describe(impl_->columns) + ")");
  }
  if (row < 0 || row >= impl_->num_rows) {
    return Error(ErrorKind::kInvalidArgument, impl_->folder + ": messages of row " +
                                                  std::to_string(row) +
                                                  " requested, but the dataset has " +
                                                  std::to_string(impl_->num_rows) + " rows");
  }
  // Rows exist, so shards exist, and each has the column (open checked they agree on columns).
  const std::size_t batch = impl_->batch_of(row, "messages");
  const std::int64_t local = row - impl_->batch_starts[batch];
  const std::string where =
      impl_->shard_paths[impl_->batch_shard[batch]] + ": row " + std::to_string(row);
  return arrow::arrow_value_json(*impl_->messages_field, impl_->messages[batch], local, where);
}

}  // namespace draftfeed
