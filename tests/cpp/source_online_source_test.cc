// OnlineSampleSource end to end in C++: a fake vLLM server on 127.0.0.1 (fake_vllm.h) that writes
// real hidden-state files into a server folder; the cache first, generation for missing rows,
// on_generate, confinement to the server folder, the consecutive-failure breaker, and the options'
// one check.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/source/online_source.h"
#include "fake_vllm.h"
#include "sample_file.h"
#include "temp_folder.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kLayers = 2;
constexpr std::int64_t kHidden = 4;

class SourceOnlineSourceTest : public TempFolderTest {
 protected:
  void SetUp() override {
    make_temp_folder("online_source", {"cache", "server", "elsewhere"});
    SyntheticOptions synthetic;
    synthetic.rows = 6;
    synthetic.min_len = 3;
    synthetic.max_len = 6;
    write_synthetic_dataset((dir_ / "data").string(), synthetic);
    dataset_ = TokenDataset::open((dir_ / "data").string());
    vllm_.write = [this](const std::vector<std::int64_t>& ids) {
      return write_file(dir_ / "server", ids);
    };
  }

  // A valid hidden-state file for `ids` in `folder`; returns its path.
  std::string write_file(const fs::path& folder, const std::vector<std::int64_t>& ids) {
    const std::string path = (folder / ("gen_" + std::to_string(++written_) + ".safetensors"));
    const std::vector<std::uint16_t> values(ids.size() * kLayers * kHidden, 0x3F80);  // bf16 1.0
    write_sample_file(path, ids, DType::kBF16, kLayers, kHidden, values);
    return path;
  }

  std::vector<std::int64_t> ids_of(std::int64_t row) const {
    const IntArrayView view = dataset_->input_ids(row);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(view.size()));
    view.copy_to(ids.data());
    return ids;
  }

  OnlineSourceOptions options(const LocalHttpServer& server) const {
    OnlineSourceOptions o;
    o.client.endpoints = {server.url()};
    o.client.retry_backoff = std::chrono::duration<double>(0.01);
    o.cache.hidden_states_path = (dir_ / "cache").string();
    o.server_dir = (dir_ / "server").string();
    o.log_failures = false;
    return o;
  }

  FetchOutcome fetch(OnlineSampleSource& source, std::int64_t row) const {
    return source.fetch(row, dataset_->input_ids(row));
  }

  std::shared_ptr<const TokenDataset> dataset_;
  FakeVllm vllm_;
  std::atomic<int> written_{0};
};

TEST_F(SourceOnlineSourceTest, GeneratesAMissingRowAndRemovesTheServersFile) {
  LocalHttpServer server(vllm_.handler());
  OnlineSampleSource source(options(server));
  const FetchOutcome outcome = fetch(source, 2);
  ASSERT_TRUE(outcome.sample.has_value()) << outcome.message;
  EXPECT_EQ(outcome.sample->hidden.tokens, dataset_->input_ids(2).size());
  EXPECT_EQ(outcome.sample->hidden.layers, kLayers);
  EXPECT_EQ(outcome.sample->hidden.hidden, kHidden);
  EXPECT_TRUE(fs::is_empty(dir_ / "server")) << "on_generate=delete removes the file it read";
  EXPECT_FALSE(fs::exists(dir_ / "cache" / "hs_2.safetensors"));
  const OnlineSourceStats stats = source.stats();
  EXPECT_EQ(stats.generated, 1);
  EXPECT_EQ(stats.deleted, 1);
  EXPECT_EQ(stats.round_trips, 1);
}

TEST_F(SourceOnlineSourceTest, OnGenerateCacheMovesTheFileSoTheNextFetchReadsTheCache) {
  LocalHttpServer server(vllm_.handler());
  OnlineSourceOptions o = options(server);
  o.on_generate = OnGenerate::kCache;
  OnlineSampleSource source(o);
  ASSERT_TRUE(fetch(source, 4).sample.has_value());
  EXPECT_TRUE(fs::exists(dir_ / "cache" / "hs_4.safetensors"));
  EXPECT_TRUE(fs::is_empty(dir_ / "server"));
  ASSERT_TRUE(fetch(source, 4).sample.has_value());
  EXPECT_EQ(vllm_.completions.load(), 1) << "the second fetch is a cache hit";
  EXPECT_EQ(source.stats().cache_hits, 1);
  EXPECT_EQ(source.stats().adopted, 1);
}

TEST_F(SourceOnlineSourceTest, ACachedRowIsServedWithoutARequest) {
  const std::vector<std::int64_t> ids = ids_of(1);
  const std::vector<std::uint16_t> values(ids.size() * kLayers * kHidden, 0x4000);
  write_sample_file((dir_ / "cache" / "hs_1.safetensors").string(), ids, DType::kBF16, kLayers,
                    kHidden, values);
  LocalHttpServer server(vllm_.handler());
  OnlineSampleSource source(options(server));
  ASSERT_TRUE(fetch(source, 1).sample.has_value());
  EXPECT_EQ(server.requests(), 0);
  EXPECT_EQ(source.stats().cache_hits, 1);
}

TEST_F(SourceOnlineSourceTest, AHandleOutsideTheServerFolderFailsAndIsLeftInPlace) {
  std::vector<std::string> handed;
  vllm_.write = [&](const std::vector<std::int64_t>& ids) {
    handed.push_back(write_file(dir_ / "elsewhere", ids));
    return handed.back();
  };
  LocalHttpServer server(vllm_.handler());
  OnlineSourceOptions o = options(server);
  o.generation_validation_retries = 1;
  OnlineSampleSource source(o);
  const FetchOutcome outcome = fetch(source, 3);
  EXPECT_FALSE(outcome.sample.has_value());
  EXPECT_EQ(outcome.reason, DropReason::kGenerationFailed);
  EXPECT_FALSE(outcome.fatal);
  EXPECT_EQ(vllm_.completions.load(), 2) << "1 + generation_validation_retries round trips";
  ASSERT_EQ(handed.size(), 2u);
  for (const std::string& path : handed) EXPECT_TRUE(fs::exists(path)) << path;
  const OnlineSourceStats stats = source.stats();
  EXPECT_EQ(stats.exhausted, 1);
  EXPECT_EQ(stats.left_in_place, 2);
  EXPECT_EQ(stats.failures.file[static_cast<std::size_t>(FileProblem::kOutsideServerDir)], 2);
}

TEST_F(SourceOnlineSourceTest, RowsFailingInARowStopTheRunAndLaterFetchesSayIt) {
  vllm_.write = [](const auto&) { return std::string("/nonexistent/hs.safetensors"); };
  LocalHttpServer server(vllm_.handler());
  OnlineSourceOptions o = options(server);
  o.server_dir.clear();
  o.generation_validation_retries = 0;
  o.max_consecutive_generation_failures = 2;
  OnlineSampleSource source(o);
  const FetchOutcome first = fetch(source, 0);
  EXPECT_EQ(first.reason, DropReason::kGenerationFailed);
  EXPECT_FALSE(first.fatal);
  const FetchOutcome second = fetch(source, 1);
  EXPECT_TRUE(second.fatal);
  EXPECT_NE(second.message.find("max_consecutive_generation_failures = 2"), std::string::npos)
      << second.message;
  const int requests = vllm_.completions.load();
  const FetchOutcome third = fetch(source, 2);
  EXPECT_TRUE(third.fatal);
  EXPECT_NE(third.message.find("failed earlier"), std::string::npos) << third.message;
  EXPECT_EQ(vllm_.completions.load(), requests) << "no request after the run failed";
  EXPECT_TRUE(source.stats().fatal);
}

TEST_F(SourceOnlineSourceTest, ItsRequestsInFlightAreTheFetchesItMayKeepBlocked) {
  LocalHttpServer server(vllm_.handler());
  OnlineSourceOptions o = options(server);
  o.client.fetch_threads = 5;
  EXPECT_EQ(OnlineSampleSource(o).blocking_fetches(), 5);
}

TEST_F(SourceOnlineSourceTest, OptionsAreCheckedOnceNamingTheField) {
  OnlineSourceOptions o;
  try {
    o.validate();
    FAIL() << "no cache folder was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("hidden_states_path"), std::string::npos);
  }
  o.cache.hidden_states_path = (dir_ / "cache").string();
  o.validate();
  EXPECT_EQ(o.cache.on_missing, OnMissing::kGenerate) << "the online source's default";
  o.max_consecutive_generation_failures = 0;
  EXPECT_THROW(o.validate(), Error);
  o.max_consecutive_generation_failures = 1;
  o.cache.fp8_dequantize_dtype = DType::kF8E4M3;
  EXPECT_THROW(o.validate(), Error);
  o.cache.fp8_dequantize_dtype = DType::kF16;
  o.client.fetch_threads = 0;
  EXPECT_THROW(OnlineSampleSource{o}, Error);
}

}  // namespace
}  // namespace draftfeed
