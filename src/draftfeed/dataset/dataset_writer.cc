#include "draftfeed/dataset/dataset_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "draftfeed/common/error.h"
#include "draftfeed/common/held_file.h"
#include "draftfeed/dataset/arrow_ipc_writer.h"

namespace draftfeed {

namespace fs = std::filesystem;

namespace {

using ordered_json = nlohmann::ordered_json;

std::string shard_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "data-%05zu-of-%05zu.arrow", index, count);
  return name;
}

// Unique to this writer (host, process, counter): two writers of one folder never share a file.
std::string temp_shard_name(const std::string& writer, std::size_t index) {
  return ".draftfeed-writing-" + writer + "-" + std::to_string(index) + ".arrow";
}

// A new file opened for writing: O_EXCL (never an existing file, never through a link).
std::FILE* create_new(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    throw Error(ErrorKind::kIo, path.string() + ": cannot create: " + os_error_text(errno));
  }
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorKind::kIo, path.string() + ": cannot create: " + os_error_text(err));
  }
  return file;
}

bool starts_ends(const std::string& name, const char* prefix, const char* suffix) {
  const std::size_t p = std::strlen(prefix), s = std::strlen(suffix);
  return name.size() >= p + s && name.compare(0, p, prefix) == 0 &&
         name.compare(name.size() - s, s, suffix) == 0;
}

// Files an earlier dataset (ours or datasets') leaves in its folder; finish() replaces them.
bool is_dataset_file(const std::string& name) {
  return name == "state.json" || name == "dataset_info.json" ||
         starts_ends(name, "data-", ".arrow") || starts_ends(name, "cache-", ".arrow") ||
         starts_ends(name, ".draftfeed-writing-", ".arrow");
}

ordered_json list_feature(const char* dtype) {
  return ordered_json{{"feature", {{"dtype", dtype}, {"_type", "Value"}}}, {"_type", "List"}};
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::string hidden(".");
  hidden += path.filename().string();
  const fs::path temp = path.parent_path() / process_unique_name(hidden, "tmp");
  std::FILE* file = create_new(temp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !ok) {
    const int err = errno;
    fs::remove(temp);
    throw Error(ErrorKind::kIo, temp.string() + ": cannot write: " + os_error_text(err));
  }
  fs::rename(temp, path);
}

}  // namespace

struct DatasetWriter::State {
  fs::path folder;
  DatasetWriterOptions options;
  std::vector<std::int64_t> shard_targets;  // rows per shard when num_shards is given

  // The shard being written.
  std::FILE* file = nullptr;
  fs::path file_path;
  std::unique_ptr<arrow::IpcStreamWriter> stream;
  std::int64_t shard_rows = 0;
  std::vector<fs::path> temp_paths;                                // every shard so far, in order
  const std::string writer_name = process_unique_name("w", "id");  // in temporary shard names
  bool finished = false;

  // The record batch being filled.
  std::vector<std::int32_t> ids_offsets{0};
  std::vector<std::int64_t> ids64;
  std::vector<std::int32_t> ids32;
  std::vector<std::int32_t> mask_offsets{0};
  std::vector<std::int64_t> mask;
  std::vector<std::int64_t> seq_len;

  DatasetWriteSummary summary;
  std::uint64_t fingerprint = 1469598103934665603ULL;  // FNV-1a over every value written

  std::vector<arrow::WriteColumn> columns() const {
    return {{"input_ids", true, false, options.input_ids_int32 ? 32 : 64, true},
            {"loss_mask", true, false, 64, true},
            {"seq_len", false, false, 64, true}};
  }

  ordered_json features() const {
    return ordered_json{{"input_ids", list_feature(options.input_ids_int32 ? "int32" : "int64")},
                        {"loss_mask", list_feature("int64")},
                        {"seq_len", {{"dtype", "int64"}, {"_type", "Value"}}}};
  }

  void open_shard() {
    file_path = folder / temp_shard_name(writer_name, temp_paths.size());
    file = create_new(file_path);
    temp_paths.push_back(file_path);
    std::setvbuf(file, nullptr, _IOFBF, 1 << 20);
    const ordered_json metadata{{"info", {{"features", features()}}}};
    stream = std::make_unique<arrow::IpcStreamWriter>(
        [this](std::span<const std::uint8_t> bytes) {
          if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) {
            throw Error(ErrorKind::kIo,
                        file_path.string() + ": cannot write: " + os_error_text(errno));
          }
        },
        columns(),
        std::vector<std::pair<std::string, std::string>>{{"huggingface", metadata.dump()}});
    shard_rows = 0;
  }

  void close_shard() {
    flush_batch();
    stream->close();
    summary.bytes += stream->bytes_written();
    stream.reset();
    const int closed = std::fclose(file);
    file = nullptr;
    if (closed != 0) {
      throw Error(ErrorKind::kIo, file_path.string() + ": cannot write: " + os_error_text(errno));
    }
  }

  template <typename T>
  static std::span<const std::uint8_t> bytes_of(const std::vector<T>& values) {
    return {reinterpret_cast<const std::uint8_t*>(values.data()), values.size() * sizeof(T)};
  }

  void flush_batch() {
    const auto rows = static_cast<std::int64_t>(seq_len.size());
    if (rows == 0) return;
    const auto id_count = static_cast<std::int64_t>(ids_offsets.back());
    const auto mask_count = static_cast<std::int64_t>(mask_offsets.back());
    const std::span<const std::uint8_t> none;
    stream->write_batch(rows, {{rows, 0}, {id_count, 0}, {rows, 0}, {mask_count, 0}, {rows, 0}},
                        {none, bytes_of(ids_offsets), none,
                         options.input_ids_int32 ? bytes_of(ids32) : bytes_of(ids64), none,
                         bytes_of(mask_offsets), none, bytes_of(mask), none, bytes_of(seq_len)});
    ids_offsets.assign(1, 0);
    mask_offsets.assign(1, 0);
    ids64.clear();
    ids32.clear();
    mask.clear();
    seq_len.clear();
  }

  void hash(std::int64_t value) {
    for (int i = 0; i < 8; ++i) {
      fingerprint ^= static_cast<std::uint8_t>(static_cast<std::uint64_t>(value) >> (8 * i));
      fingerprint *= 1099511628211ULL;
    }
  }
};

DatasetWriter::DatasetWriter(const std::string& folder, DatasetWriterOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.folder = folder;
  s.options = std::move(options);
  const auto& o = s.options;
  require(
      o.rows_per_batch > 0, ErrorKind::kInvalidArgument,
      "DatasetWriter: rows_per_batch must be positive, got " + std::to_string(o.rows_per_batch));
  require(o.num_shards >= 0, ErrorKind::kInvalidArgument,
          "DatasetWriter: num_shards must be >= 0, got " + std::to_string(o.num_shards));
  require(o.num_shards == 0 || o.total_rows >= 0, ErrorKind::kInvalidArgument,
          "DatasetWriter: num_shards=" + std::to_string(o.num_shards) +
              " needs total_rows (the rows are split into contiguous shards)");
  require(o.max_shard_bytes > 0, ErrorKind::kInvalidArgument,
          "DatasetWriter: max_shard_bytes must be positive");
  if (o.num_shards > 0) {
    // datasets' contiguous sharding: the first (n % k) shards take one extra row.
    for (std::int64_t k = 0; k < o.num_shards; ++k) {
      s.shard_targets.push_back(o.total_rows / o.num_shards +
                                (k < o.total_rows % o.num_shards ? 1 : 0));
    }
  }
  std::error_code ec;
  fs::create_directories(s.folder, ec);
  if (ec || !fs::is_directory(s.folder)) {
    throw Error(ErrorKind::kIo,
                folder + ": cannot create the folder" + (ec ? ": " + ec.message() : std::string()));
  }
  for (const auto& entry : fs::directory_iterator(s.folder)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() && !is_dataset_file(name)) {
      throw Error(ErrorKind::kInvalidArgument,
                  folder + " already holds '" + name +
                      "', which is not part of a dataset; write into an empty or new folder");
    }
  }
}

DatasetWriter::~DatasetWriter() {
  if (state_->finished) return;
  if (state_->file != nullptr) std::fclose(state_->file);
  std::error_code ec;
  for (const auto& path : state_->temp_paths) fs::remove(path, ec);
}

std::int64_t DatasetWriter::rows() const { return state_->summary.rows; }

void DatasetWriter::add_row(std::span<const std::int64_t> input_ids,
                            std::span<const std::int64_t> loss_mask) {
  State& s = *state_;
  require(!s.finished, ErrorKind::kRuntime, "DatasetWriter: add_row after finish");
  const std::int64_t row = s.summary.rows;
  if (input_ids.size() != loss_mask.size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "DatasetWriter: row " + std::to_string(row) + " has " +
                    std::to_string(input_ids.size()) + " input_ids but " +
                    std::to_string(loss_mask.size()) + " loss_mask values");
  }
  if (s.options.total_rows >= 0 && row >= s.options.total_rows) {
    throw Error(ErrorKind::kInvalidArgument,
                "DatasetWriter: row " + std::to_string(row) +
                    " is past total_rows=" + std::to_string(s.options.total_rows));
  }
  // A list's int32 offsets cap one record batch at 2^31 - 1 values.
  constexpr auto kMaxValues = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());
  if (input_ids.size() > kMaxValues - static_cast<std::size_t>(s.ids_offsets.back())) {
    throw Error(ErrorKind::kInvalidArgument,
                "DatasetWriter: row " + std::to_string(row) + " (" +
                    std::to_string(input_ids.size()) +
                    " tokens) overflows a record batch's 2^31 values; lower rows_per_batch");
  }
  if (s.stream == nullptr) s.open_shard();
  if (s.options.input_ids_int32) {
    for (const auto id : input_ids) {
      if (id < std::numeric_limits<std::int32_t>::min() ||
          id > std::numeric_limits<std::int32_t>::max()) {
        throw Error(ErrorKind::kInvalidArgument, "DatasetWriter: row " + std::to_string(row) +
                                                     " has token id " + std::to_string(id) +
                                                     ", which does not fit the int32 column");
      }
      s.ids32.push_back(static_cast<std::int32_t>(id));
    }
  } else {
    s.ids64.insert(s.ids64.end(), input_ids.begin(), input_ids.end());
  }
  s.mask.insert(s.mask.end(), loss_mask.begin(), loss_mask.end());
  const auto length = static_cast<std::int32_t>(input_ids.size());
  s.ids_offsets.push_back(s.ids_offsets.back() + length);
  s.mask_offsets.push_back(s.mask_offsets.back() + length);
  s.seq_len.push_back(length);
  for (const auto id : input_ids) s.hash(id);
  for (const auto m : loss_mask) s.hash(m);
  ++s.summary.rows;
  s.summary.tokens += length;
  ++s.shard_rows;

  if (static_cast<std::int64_t>(s.seq_len.size()) == s.options.rows_per_batch) s.flush_batch();
  if (s.options.num_shards > 0) {
    // The last shard stays open for finish(); earlier ones close at their row count.
    const std::size_t shard = s.temp_paths.size() - 1;
    if (shard + 1 < s.shard_targets.size() && s.shard_rows == s.shard_targets[shard]) {
      s.close_shard();
    }
  } else if (s.seq_len.empty() &&
             s.stream->bytes_written() >= static_cast<std::uint64_t>(s.options.max_shard_bytes)) {
    s.close_shard();
  }
}

DatasetWriteSummary DatasetWriter::finish() {
  State& s = *state_;
  require(!s.finished, ErrorKind::kRuntime, "DatasetWriter: finish called twice");
  if (s.options.total_rows >= 0 && s.summary.rows != s.options.total_rows) {
    throw Error(ErrorKind::kInvalidArgument,
                "DatasetWriter: " + std::to_string(s.summary.rows) +
                    " rows were added but total_rows=" + std::to_string(s.options.total_rows));
  }
  if (s.stream != nullptr) s.close_shard();
  // Shards still owed: an empty dataset has one, and num_shards > rows leaves empty ones.
  const std::size_t wanted =
      std::max<std::size_t>(1, static_cast<std::size_t>(s.options.num_shards));
  while (s.temp_paths.size() < wanted) {
    s.open_shard();
    s.close_shard();
  }

  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(s.folder)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() && is_dataset_file(name) &&
        !starts_ends(name, ".draftfeed-writing-", ".arrow")) {
      fs::remove(entry.path(), ec);
    }
  }
  ordered_json files = ordered_json::array();
  for (std::size_t i = 0; i < s.temp_paths.size(); ++i) {
    const std::string name = shard_name(i, s.temp_paths.size());
    fs::rename(s.temp_paths[i], s.folder / name);
    files.push_back({{"filename", name}});
    s.summary.shard_paths.push_back((s.folder / name).string());
  }
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof(fingerprint), "%016llx",
                static_cast<unsigned long long>(s.fingerprint));
  const ordered_json state{
      {"_data_files", files},
      {"_fingerprint", fingerprint},
      {"_format_columns", nullptr},
      {"_format_kwargs", ordered_json::object()},
      {"_format_type",
       s.options.format_type.empty() ? ordered_json(nullptr) : ordered_json(s.options.format_type)},
      {"_output_all_columns", false},
      {"_split", nullptr}};
  const ordered_json info{{"citation", ""},
                          {"description", ""},
                          {"features", s.features()},
                          {"homepage", ""},
                          {"license", ""}};
  write_text_file(s.folder / "dataset_info.json", info.dump(2));
  write_text_file(s.folder / "state.json", state.dump(2));
  s.finished = true;
  return s.summary;
}

}  // namespace draftfeed
