// A dataset shard truncated under its reader (another process cutting or rewriting the file while
// it is mapped): every read of the mapping is guarded, so each one ends as an error naming the
// shard and the row, or a counted drop, never a SIGBUS. The opening parse (stream metadata,
// offsets, validity, seq_len), a row's values, the batch's integer tensors, a `messages` value and
// a running loader's epoch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "draftfeed/batch/assemble.h"
#include "draftfeed/common/mapped_file.h"
#include "draftfeed/dataset/arrow_ipc.h"
#include "draftfeed/dataset/arrow_json.h"
#include "draftfeed/dataset/dataset_writer.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/dataset/token_columns.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "draftfeed/loader/loader.h"
#include "draftfeed/source/sample_source.h"
#include "sigbus_recovery.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kRows = 3000;

class TruncatedShardTest : public TempFolderTest {
 protected:
  void SetUp() override {
    SKIP_WHERE_SIGBUS_CANNOT_BE_RECOVERED();
    make_temp_folder("truncated_shard");
    synthetic_.rows = kRows;
    synthetic_.min_len = 8;
    synthetic_.max_len = 40;
    synthetic_.seed = 3;
    DatasetWriterOptions writer;
    writer.num_shards = 1;
    shard_ = write_synthetic_dataset(data(), synthetic_, writer).shard_paths.at(0);
  }

  std::string data() const { return (dir_ / "data").string(); }

  // Cuts the shard to its first page: the schema message, no record batch.
  void cut_shard() const { fs::resize_file(shard_, static_cast<std::uintmax_t>(::getpagesize())); }

  std::string unreadable(std::int64_t row, const char* column) const {
    return shard_ + ": row " + std::to_string(row) + ": its " + column +
           " could not be read: the shard shrank under the reader (truncated or rewritten by "
           "another process)";
  }

  SyntheticOptions synthetic_;
  std::string shard_;
};

TEST_F(TruncatedShardTest, ARowCutUnderTheReaderIsANamedErrorAndItsBoundsStayReadable) {
  const auto dataset = TokenDataset::open(data());
  const std::vector<std::int64_t> lengths(dataset->seq_lens().begin(), dataset->seq_lens().end());
  cut_shard();

  // Bounds and lengths were copied at open: the planner's input and a row's size read nothing of
  // the mapping.
  EXPECT_EQ(std::vector<std::int64_t>(dataset->seq_lens().begin(), dataset->seq_lens().end()),
            lengths);
  const std::int64_t row = kRows - 1;
  const IntArrayView ids = dataset->input_ids(row);
  EXPECT_EQ(ids.size(), lengths.back());
  EXPECT_EQ(*ids.shard, shard_);

  std::vector<std::int64_t> out(static_cast<std::size_t>(ids.size()));
  EXPECT_FALSE(ids.guarded_copy_to(out.data()));
  const Error error = unreadable_row(ids, row, "input_ids");
  EXPECT_EQ(error.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(error.what()), unreadable(row, "input_ids"));
}

TEST_F(TruncatedShardTest, TheOpeningParseOfAShardCutUnderItIsAnError) {
  // What TokenDataset::open does with a shard, with the cut between the mapping and each read.
  const auto stream_cut = MappedFile::open_or_throw(shard_);
  const auto columns_cut = MappedFile::open_or_throw(shard_);
  const arrow::IpcStream stream = arrow::read_ipc_stream(columns_cut->bytes(), shard_).value();
  cut_shard();

  const Result<arrow::IpcStream> parsed = arrow::read_ipc_stream(stream_cut->bytes(), shard_);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().kind(), ErrorKind::kIo);
  EXPECT_NE(std::string(parsed.error().what()).find(shard_ + ": shrank while the message at byte "),
            std::string::npos)
      << parsed.error().what();

  std::vector<std::int64_t> seq_lens;
  const Result<ShardColumns> read = read_token_columns(stream, shard_, 0, &seq_lens);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error().kind(), ErrorKind::kIo);
  EXPECT_NE(std::string(read.error().what())
                .find(shard_ + ": record batch 0, column 'input_ids': the shard shrank while its "
                               "offsets were read"),
            std::string::npos)
      << read.error().what();
}

TEST_F(TruncatedShardTest, TheBatchIntegerWritesNameTheSampleWhoseShardShrank) {
  const auto dataset = TokenDataset::open(data());
  BatchSpec spec;
  spec.max_len = 128;
  spec.hidden_size = 4;
  const BatchLayout layout = make_batch_layout(spec);
  std::vector<std::uint8_t> buffer(layout.total_bytes);
  const BatchMemory memory = contiguous_memory(layout, buffer.data());
  // The cut keeps the pages up to row 1's token ids (found by their bytes in the shard), not the
  // last row's, some 500 KB later.
  const std::vector<std::int64_t> rows_of = {1, kRows - 1};
  std::vector<IntArrayView> ids, masks;
  std::vector<std::int64_t> rows;
  for (const std::int64_t row : rows_of) {
    ids.push_back(dataset->input_ids(row));
    masks.push_back(dataset->loss_mask(row));
    rows.push_back(ids.back().size());
  }
  const BatchPlacement placement = place_samples(spec.max_len, rows, {1, 1});
  ASSERT_EQ(placement.samples.size(), 2u);
  EXPECT_FALSE(finish_batch(layout, memory, placement, ids, masks).has_value());

  std::vector<std::int64_t> row1_ids, row1_mask;
  synthetic_row(synthetic_, 1, &row1_ids, &row1_mask);
  std::vector<char> file(fs::file_size(shard_));
  FILE* in = std::fopen(shard_.c_str(), "rb");
  ASSERT_NE(in, nullptr);
  ASSERT_EQ(std::fread(file.data(), 1, file.size(), in), file.size());
  std::fclose(in);
  const char* needle = reinterpret_cast<const char*>(row1_ids.data());
  const auto found = std::search(file.begin(), file.end(), needle,
                                 needle + row1_ids.size() * sizeof(std::int64_t));
  ASSERT_NE(found, file.end());
  const auto page = static_cast<std::size_t>(::getpagesize());
  const std::size_t keep =
      (static_cast<std::size_t>(found - file.begin()) + row1_ids.size() * 8 + page) / page * page;
  ASSERT_LT(keep + page, file.size());
  fs::resize_file(shard_, keep);
  // Row 1's mask lies in a later buffer (after every row's ids), past the cut: read from a copy.
  masks[0] = IntArrayView{reinterpret_cast<const std::uint8_t*>(row1_mask.data()),
                          static_cast<std::int64_t>(row1_mask.size()), 8, true, nullptr};
  const std::optional<UnreadableSample> unreadable_sample =
      finish_batch(layout, memory, placement, ids, masks);
  ASSERT_TRUE(unreadable_sample.has_value());
  EXPECT_EQ(placement.samples[unreadable_sample->placed].sample, 1u);
  EXPECT_STREQ(unreadable_sample->column, "input_ids");
}

TEST_F(TruncatedShardTest, AMessagesValueCutUnderTheWalkIsAnError) {
  // A string array whose bytes lie in a mapped file, cut before the walk reads them.
  const std::string path = (dir_ / "strings").string();
  {
    std::vector<char> bytes(static_cast<std::size_t>(3 * ::getpagesize()), 'a');
    FILE* file = std::fopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), file), bytes.size());
    std::fclose(file);
  }
  const auto mapping = MappedFile::open_or_throw(path);
  std::vector<std::int32_t> offsets = {0, static_cast<std::int32_t>(mapping->size())};
  arrow::Field field;
  field.name = "messages";
  field.type_id = arrow::TypeId::kUtf8;
  field.type = "string";
  const arrow::ArrayView array{
      1,
      0,
      {{},
       {reinterpret_cast<const std::uint8_t*>(offsets.data()), offsets.size() * 4},
       mapping->bytes()},
      {}};
  EXPECT_TRUE(arrow::arrow_value_json(field, array, 0, "shard: row 0").ok());
  fs::resize_file(path, 0);
  const Result<std::string> json = arrow::arrow_value_json(field, array, 0, "shard: row 0");
  ASSERT_FALSE(json.ok());
  EXPECT_EQ(json.error().kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(json.error().what()),
            "shard: row 0: column 'messages' (type string), messages: the shard shrank while the "
            "value was read (truncated or rewritten by another process)");
}

TEST_F(TruncatedShardTest, ARunningLoaderCountsTheRowsOfAShardCutUnderItAsDrops) {
  SyntheticHiddenStateSpec cache;
  cache.hidden_size = 8;
  cache.layers = 2;
  cache.threads = 1;
  write_synthetic_hidden_states(
      data() + "/hidden_states", kRows,
      [this](std::int64_t row, std::vector<std::int64_t>& ids) {
        std::vector<std::int64_t> mask;
        synthetic_row(synthetic_, row, &ids, &mask);
      },
      cache);
  LoaderOptions options;
  options.data_path = data();
  options.split = Split::kAll;
  options.batch.max_len = 256;
  options.batch.hidden_size = cache.hidden_size;
  options.batch.num_target_layers = cache.layers - 1;
  options.batch.dtype = DType::kF32;
  options.pipeline.num_threads = 2;
  options.pipeline.buffers = 2;
  options.pipeline.try_pin = false;
  options.pipeline.max_drop_examples = 4;
  Loader loader(options);
  const std::int64_t batches = loader.plan(0).num_batches();
  loader.start_epoch(0);
  ASSERT_NE(loader.next(), nullptr);
  cut_shard();

  std::int64_t delivered = 1;
  std::vector<std::string> drops;
  while (auto lease = loader.next()) {
    ++delivered;
    for (const auto& [reason, message] : lease->drop_messages) {
      EXPECT_EQ(reason, DropReason::kInvalid) << message;
      drops.push_back(message);
    }
  }
  EXPECT_EQ(delivered, batches);
  EXPECT_GT(loader.metrics().dropped[static_cast<std::size_t>(DropReason::kInvalid)], 0);
  ASSERT_FALSE(drops.empty());
  // Each names the shard and its row, whichever read met the cut (the check of the cached ids,
  // or the batch's integer tensors).
  for (const std::string& message : drops) {
    EXPECT_EQ(message.rfind(shard_ + ": row ", 0), 0u) << message;
    EXPECT_NE(message.find(" could not be read: the shard shrank under the reader"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace draftfeed
