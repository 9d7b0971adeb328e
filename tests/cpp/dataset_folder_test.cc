// A save_to_disk folder written by DatasetWriter (synthetic rows) read back by TokenDataset, the
// train/val split, and the folder-level errors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "draftfeed/dataset/dataset_summary.h"
#include "draftfeed/dataset/dataset_writer.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/dataset/token_dataset.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;

class TempFolder {
 public:
  TempFolder() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("draftfeed-dataset-test-" + std::to_string(::getpid()) +
                                         "-" + std::to_string(counter++));
    fs::remove_all(path_);
  }
  ~TempFolder() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

std::string open_error(const std::string& folder, ErrorKind* kind = nullptr) {
  try {
    TokenDataset::open(folder);
  } catch (const Error& error) {
    if (kind) *kind = error.kind();
    return error.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(DatasetFolder, SyntheticRowsRoundTrip) {
  TempFolder folder;
  const SyntheticOptions options{2345, 17, 0, 40, 500};
  DatasetWriterOptions writer;
  writer.num_shards = 3;
  writer.input_ids_int32 = true;
  const auto summary = write_synthetic_dataset(folder.str(), options, writer);
  EXPECT_EQ(summary.rows, 2345);
  ASSERT_EQ(summary.shard_paths.size(), 3u);
  EXPECT_EQ(fs::path(summary.shard_paths[2]).filename(), "data-00002-of-00003.arrow");

  const auto dataset = TokenDataset::open(folder.str());
  EXPECT_EQ(dataset->num_rows(), 2345);
  EXPECT_EQ(dataset->total_tokens(), summary.tokens);
  EXPECT_EQ(dataset->columns()[0].type, "list<int32>");
  EXPECT_TRUE(dataset->has_column("seq_len"));
  EXPECT_FALSE(dataset->has_column("messages"));
  std::vector<std::int64_t> ids, mask;
  for (std::int64_t row = 0; row < 2345; ++row) {
    synthetic_row(options, row, &ids, &mask);
    ASSERT_TRUE(dataset->input_ids(row).equals(ids)) << row;
    ASSERT_TRUE(dataset->loss_mask(row).equals(mask)) << row;
    ASSERT_EQ(dataset->seq_lens()[static_cast<std::size_t>(row)],
              static_cast<std::int64_t>(ids.size()));
  }
  EXPECT_EQ(dataset->input_ids(5).byte_width, 4);
  EXPECT_THROW(dataset->input_ids(2345), Error);
  EXPECT_THROW(dataset->loss_mask(-1), Error);

  const DatasetSummary s = summarize(*dataset, 4);
  EXPECT_EQ(s.rows, 2345);
  std::int64_t counted = 0;
  for (const auto c : s.bin_counts) counted += c;
  EXPECT_EQ(counted, 2345);
  EXPECT_EQ(summary_json(s)["columns"]["loss_mask"], "list<int64>");
}

TEST(DatasetFolder, SplitFollowsPythonInt) {
  TempFolder folder;
  write_synthetic_dataset(folder.str(), {10, 1, 1, 5, 100});
  const auto dataset = TokenDataset::open(folder.str());
  const auto [train, val] = split_train_val(dataset, 0.7);
  // int(10 * 0.7) == 7 in Python (10 * 0.7 == 7.000000000000001)
  EXPECT_EQ(train.begin, 0);
  EXPECT_EQ(train.end, 7);
  EXPECT_EQ(val.begin, 7);
  EXPECT_EQ(val.end, 10);
  EXPECT_EQ(val.global_row(2), 9);
  EXPECT_EQ(val.seq_lens().size(), 3u);
  EXPECT_EQ(val.seq_lens()[0], dataset->seq_lens()[7]);
  // int(10 * 0.29) == 2 (2.9 truncates)
  EXPECT_EQ(split_train_val(dataset, 0.29).first.end, 2);
  try {
    split_train_val(dataset, 0.05);
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(
        std::string(error.what())
            .find("10 rows with train_ratio 0.05 give split index 0, so the train split is empty"),
        std::string::npos);
  }
  EXPECT_THROW(split_train_val(dataset, 1.0), Error);
}

TEST(DatasetFolder, FolderErrors) {
  TempFolder folder;
  ErrorKind kind{};
  EXPECT_EQ(open_error(folder.str(), &kind), "dataset folder " + folder.str() + " does not exist");
  EXPECT_EQ(kind, ErrorKind::kNotFound);

  fs::create_directories(folder.path() / "train");
  std::ofstream(folder.path() / "dataset_dict.json") << R"({"splits": ["train", "validation"]})";
  EXPECT_EQ(open_error(folder.str(), &kind),
            folder.str() +
                " is a DatasetDict with splits [train, validation], not a single dataset; pass one "
                "split's folder, e.g. " +
                (folder.path() / "train").string());
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
}

// The open's error, on another thread: an open that blocks (a FIFO's open waits for a writer)
// ends the test program after a hang guard instead of hanging it.
std::string bounded_open_error(const std::string& folder) {
  auto opened = std::async(std::launch::async, [folder] { return open_error(folder); });
  if (opened.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "TokenDataset::open(%s) blocked\n", folder.c_str());
    std::_Exit(1);
  }
  return opened.get();
}

TEST(DatasetFolder, ControlFilesAreReadOnlyFromRegularFilesOfBoundedSize) {
  TempFolder folder;
  write_synthetic_dataset(folder.str(), {20, 0, 1, 9, 50});
  const fs::path state = folder.path() / "state.json";
  const fs::path saved = folder.path() / "state.saved";
  fs::rename(state, saved);

  ASSERT_EQ(::mkfifo(state.c_str(), 0644), 0);
  EXPECT_EQ(bounded_open_error(folder.str()), state.string() + ": is a FIFO, not a regular file");

  fs::remove(state);
  fs::create_symlink("/dev/zero", state);
  EXPECT_EQ(bounded_open_error(folder.str()),
            state.string() + ": is a character device, not a regular file");

  fs::remove(state);
  {
    // Sparse: refused by its size before a byte is read.
    std::ofstream grow(state);
  }
  fs::resize_file(state, std::uint64_t{5} << 30);
  EXPECT_EQ(bounded_open_error(folder.str()),
            state.string() +
                ": is 5 GiB (5368709120 bytes), more than the 64 MiB a dataset's "
                "state.json may be");

  // A link to a regular file is followed (a Hugging Face hub snapshot's files are links into its
  // blob store).
  fs::remove(state);
  fs::create_symlink(saved, state);
  EXPECT_EQ(TokenDataset::open(folder.str())->num_rows(), 20);

  // A DatasetDict's dataset_dict.json that is a FIFO: still refused as a DatasetDict, at once.
  ASSERT_EQ(::mkfifo((folder.path() / "dataset_dict.json").c_str(), 0644), 0);
  EXPECT_NE(bounded_open_error(folder.str()).find(" is a DatasetDict with splits []"),
            std::string::npos);
}

TEST(DatasetFolder, ZeroRowDatasetInfoIsAControlFileToo) {
  TempFolder folder;
  fs::create_directories(folder.path());
  std::ofstream(folder.path() / "state.json") << R"({"_data_files": []})";
  ASSERT_EQ(::mkfifo((folder.path() / "dataset_info.json").c_str(), 0644), 0);
  EXPECT_EQ(bounded_open_error(folder.str()),
            (folder.path() / "dataset_info.json").string() + ": is a FIFO, not a regular file");
}

TEST(DatasetFolder, EmptyDatasetHasOneEmptyShard) {
  TempFolder folder;
  const auto summary = write_synthetic_dataset(folder.str(), {0, 0, 1, 2, 10});
  EXPECT_EQ(summary.shard_paths.size(), 1u);
  const auto dataset = TokenDataset::open(folder.str());
  EXPECT_EQ(dataset->num_rows(), 0);
  EXPECT_TRUE(dataset->seq_lens().empty());
  EXPECT_TRUE(dataset->has_loss_mask());
}

TEST(DatasetFolder, SyntheticIsDeterministicAndSeedDependent) {
  const SyntheticOptions a{10, 3, 2, 9, 50};
  SyntheticOptions b = a;
  b.seed = 4;
  std::vector<std::int64_t> ids_a, mask_a, ids_b, mask_b, again, mask_again;
  synthetic_row(a, 6, &ids_a, &mask_a);
  synthetic_row(a, 6, &again, &mask_again);
  synthetic_row(b, 6, &ids_b, &mask_b);
  EXPECT_EQ(ids_a, again);
  EXPECT_NE(ids_a, ids_b);
  EXPECT_EQ(static_cast<std::int64_t>(ids_a.size()), synthetic_row_length(a, 6));
  for (std::size_t t = 0; t < ids_a.size(); ++t) {
    EXPECT_EQ(ids_a[t], synthetic_token(a, 6, static_cast<std::int64_t>(t)));
    EXPECT_EQ(mask_a[t], synthetic_loss_mask(a, 6, static_cast<std::int64_t>(t)));
  }
  EXPECT_THROW(validate({1, 0, 5, 4, 10}), Error);
  EXPECT_THROW(validate({1, 0, 1, 4, 0}), Error);
}

}  // namespace
}  // namespace draftfeed
