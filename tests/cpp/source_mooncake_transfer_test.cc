// The native Mooncake transfer over an in-memory store with Mooncake's statuses: objects laid out
// as hs-connectors' connector lays them out (mooncake_manifest.h) are read whole into registered
// staging memory, many keys in one round; missing keys are polled until key_wait, error markers
// win, objects of the wrong size and tensors that do not match the row fail, removal takes the key
// and its marker, cancel ends a wait. The real store is tested in tests/python/test_mooncake_*.py.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/source/mooncake_manifest.h"
#include "draftfeed/source/mooncake_transfer.h"
#include "draftfeed/source/staging_pool.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

// A Mooncake store in memory: batch_get_into only into registered memory (-1 otherwise), -704 for
// a missing key, -600 for a buffer smaller than the object; `hold` blocks the next round until
// release(); `appear_after` puts an object once that many rounds have looked for it.
class MemoryStore : public MooncakeStoreClient, public MooncakeStoreCalls {
 public:
  void setup() override { ++setups; }
  std::string description() const override { return "memory store"; }
  void round(const std::function<void(MooncakeStoreCalls&)>& calls) override {
    std::unique_lock lock(mutex);
    ++rounds;
    entered.notify_all();
    entered.wait_for(lock, 30s, [&] { return !hold; });
    if (fail_rounds > 0) {
      --fail_rounds;
      throw std::runtime_error("RuntimeError: the client lost its master");
    }
    calls(*this);
  }
  std::vector<std::int64_t> batch_is_exist(const std::vector<std::string>& keys) override {
    std::vector<std::int64_t> out;
    for (const auto& key : keys) out.push_back(objects.count(key) ? 1 : 0);
    return out;
  }
  std::vector<std::int64_t> batch_get_into(const std::vector<std::string>& keys,
                                           const std::vector<std::uint8_t*>& buffers,
                                           const std::vector<std::uint64_t>& sizes) override {
    keys_per_read.push_back(static_cast<int>(keys.size()));
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto later = appear_after.find(keys[i]);
      if (later != appear_after.end() && --later->second.first <= 0) {
        objects[keys[i]] = later->second.second;
        appear_after.erase(later);
      }
      const auto found = objects.find(keys[i]);
      if (being_written(keys[i])) {
        out.push_back(kMooncakeNotReady);
      } else if (found == objects.end()) {
        out.push_back(kMooncakeObjectNotFound);
      } else if (!registered_range(buffers[i], sizes[i])) {
        out.push_back(-1);
      } else if (found->second.size() > sizes[i]) {
        out.push_back(kMooncakeInvalidParams);
      } else {
        std::memcpy(buffers[i], found->second.data(), found->second.size());
        out.push_back(static_cast<std::int64_t>(found->second.size()));
      }
    }
    return out;
  }
  std::int64_t get_size(const std::string& key) override {
    const auto found = objects.find(key);
    return found == objects.end() ? kMooncakeObjectNotFound
                                  : static_cast<std::int64_t>(found->second.size());
  }
  std::string get(const std::string& key) override {
    const auto found = objects.find(key);
    return found == objects.end() ? std::string() : found->second;
  }
  std::vector<std::int64_t> batch_remove(const std::vector<std::string>& keys) override {
    std::vector<std::int64_t> out;
    for (const auto& key : keys) {
      if (refuse_remove) {
        out.push_back(-800);
      } else if (being_written(key)) {
        out.push_back(kMooncakeNotReady);
      } else {
        out.push_back(objects.erase(key) ? 0 : kMooncakeObjectNotFound);
      }
    }
    return out;
  }
  std::int64_t register_buffer(std::uint8_t* address, std::uint64_t size) override {
    registered.emplace_back(address, size);
    return 0;
  }

  // A put under way: -703 for `writing[key]` more looks.
  bool being_written(const std::string& key) {
    const auto found = writing.find(key);
    if (found == writing.end()) return false;
    if (--found->second <= 0) writing.erase(found);
    return true;
  }
  bool registered_range(const std::uint8_t* p, std::uint64_t size) const {
    for (const auto& [base, length] : registered) {
      if (p >= base && p + size <= base + length) return true;
    }
    return false;
  }
  void release() {
    std::lock_guard lock(mutex);
    hold = false;
    entered.notify_all();
  }
  bool wait_rounds(int n) {
    std::unique_lock lock(mutex);
    return entered.wait_for(lock, 10s, [&] { return rounds >= n; });
  }

  std::mutex mutex;
  std::condition_variable entered;
  bool hold = false;
  int rounds = 0;
  int setups = 0;
  int fail_rounds = 0;
  bool refuse_remove = false;
  std::map<std::string, std::string> objects;
  std::map<std::string, std::pair<int, std::string>> appear_after;
  std::map<std::string, int> writing;
  std::vector<std::pair<std::uint8_t*, std::uint64_t>> registered;
  std::vector<int> keys_per_read;
};

constexpr std::int64_t kLayers = 3;
constexpr std::int64_t kHidden = 8;

std::uint64_t align64(std::uint64_t n) { return (n + 63) / 64 * 64; }

float value_at(std::int64_t t, std::int64_t l, std::int64_t h) {
  return static_cast<float>(t * 100 + l * 10 + h) / 7.0f;
}

// What hs-connectors' connector answers and puts for `ids` (bf16 hidden states, int64 token ids).
struct Sample {
  std::string manifest;
  std::string object;
};

Sample sample_for(const std::string& key, const std::vector<std::int64_t>& ids) {
  const auto tokens = static_cast<std::int64_t>(ids.size());
  const std::uint64_t hs_bytes = static_cast<std::uint64_t>(tokens * kLayers * kHidden) * 2;
  const std::uint64_t id_offset = align64(hs_bytes);
  const std::uint64_t total = align64(id_offset + ids.size() * 8);
  Sample out;
  out.object.assign(total, '\0');
  std::size_t i = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t l = 0; l < kLayers; ++l) {
      for (std::int64_t h = 0; h < kHidden; ++h, ++i) {
        const std::uint16_t bits = float_to_bf16(value_at(t, l, h));
        std::memcpy(out.object.data() + i * 2, &bits, 2);
      }
    }
  }
  std::memcpy(out.object.data() + id_offset, ids.data(), ids.size() * 8);
  Json manifest = {
      {"handle", key},
      {"version", 1},
      {"tensors",
       {{"hidden_states",
         {{"shape", {tokens, kLayers, kHidden}},
          {"dtype", "torch.bfloat16"},
          {"nbytes", hs_bytes},
          {"offset", 0}}},
        {"token_ids",
         {{"shape", {tokens}},
          {"dtype", "torch.int64"},
          {"nbytes", ids.size() * 8},
          {"offset", id_offset}}}}},
      {"metadata",
       {{"num_tokens", tokens}, {"total_aligned_bytes", total}, {"extract_mode", "prompt_only"}}}};
  out.manifest = manifest.dump();
  return out;
}

MooncakeTransferOptions quick(double key_wait = 2.0) {
  MooncakeTransferOptions options;
  options.key_wait = std::chrono::duration<double>(key_wait);
  options.poll_interval = std::chrono::duration<double>(0.01);
  options.staging_chunk_bytes = 1 << 20;
  return options;
}

const std::vector<std::int64_t> kIds = {5, 9, 2, 7};

TEST(MooncakeTransfer, ReadsAnObjectIntoRegisteredMemoryAndViewsItsHiddenStates) {
  auto store = std::make_shared<MemoryStore>();
  const Sample s = sample_for("cmpl-a", kIds);
  store->objects["cmpl-a"] = s.object;
  MooncakeTransfer transfer(store, quick());
  transfer.setup();
  EXPECT_EQ(store->setups, 1);
  Result<FetchedSample> got = transfer.get_generated(s.manifest, "cmpl-a", 3, kIds);
  ASSERT_TRUE(got.ok()) << got.error().what();
  const HiddenStatesView& hs = got.value().hidden;
  EXPECT_EQ(hs.dtype, DType::kBF16);
  EXPECT_EQ(hs.tokens, 4);
  EXPECT_EQ(hs.layers, kLayers);
  EXPECT_EQ(hs.hidden, kHidden);
  std::uint16_t bits = 0;
  std::memcpy(&bits, hs.data + ((2 * kLayers + 1) * kHidden + 5) * 2, 2);
  EXPECT_EQ(bits, float_to_bf16(value_at(2, 1, 5)));
  EXPECT_TRUE(store->registered_range(hs.data, s.object.size()));
  EXPECT_EQ(store->registered.size(), 1u);  // registered once
  const MooncakeTransferStats stats = transfer.stats();
  EXPECT_EQ(stats.reads, 1);
  EXPECT_EQ(stats.bytes_read, s.object.size());
  EXPECT_EQ(stats.staging.regions, 1);
  got = Error(ErrorKind::kRuntime, "released");
  EXPECT_EQ(transfer.stats().staging.regions, 0);  // the region went back with the sample
  EXPECT_FALSE(transfer.cache("cmpl-a", 3));
  EXPECT_EQ(transfer.loads_beside_requests(8), 8);
  EXPECT_FALSE(transfer.get_cached(3, IntArrayView{}).sample.has_value());
}

TEST(MooncakeTransfer, ReadsTheKeysQueuedMeanwhileInOneRound) {
  auto store = std::make_shared<MemoryStore>();
  constexpr int kRows = 8;
  std::vector<Sample> samples;
  for (int r = 0; r < kRows; ++r) {
    samples.push_back(sample_for("k" + std::to_string(r), {r, r + 1, r + 2}));
    store->objects["k" + std::to_string(r)] = samples.back().object;
  }
  MooncakeTransfer transfer(store, quick());
  // A first read registers the staging memory (one chunk holds every sample here).
  const std::vector<std::int64_t> first = {0, 1, 2};
  ASSERT_TRUE(transfer.get_generated(samples[0].manifest, "k0", 0, first).ok());
  const int before = store->rounds;
  store->hold = true;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    const std::vector<std::int64_t> ids = {0, 1, 2};
    ok += transfer.get_generated(samples[0].manifest, "k0", 0, ids).ok() ? 1 : 0;
  });
  // Row 0's round is held in the store while the other rows queue.
  ASSERT_TRUE(store->wait_rounds(before + 1));
  for (int r = 1; r < kRows; ++r) {
    threads.emplace_back([&, r] {
      const std::vector<std::int64_t> ids = {r, r + 1, r + 2};
      ok +=
          transfer.get_generated(samples[r].manifest, "k" + std::to_string(r), r, ids).ok() ? 1 : 0;
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (transfer.stats().queued_reads < kRows - 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(transfer.stats().queued_reads, kRows - 1);
  store->release();
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok, kRows);
  std::lock_guard lock(store->mutex);
  EXPECT_EQ(store->keys_per_read, (std::vector<int>{1, 1, kRows - 1}));
  EXPECT_EQ(transfer.stats().max_keys_in_round, kRows - 1);
}

TEST(MooncakeTransfer, PollsAKeyThatComesLaterAndTimesOutOneThatNeverComes) {
  auto store = std::make_shared<MemoryStore>();
  const Sample later = sample_for("later", kIds);
  store->appear_after["later"] = {3, later.object};
  MooncakeTransfer transfer(store, quick(5.0));
  Result<FetchedSample> got = transfer.get_generated(later.manifest, "later", 1, kIds);
  ASSERT_TRUE(got.ok()) << got.error().what();
  EXPECT_EQ(transfer.stats().polls, 2);

  MooncakeTransfer waiting(store, quick(0.2));
  const Sample never = sample_for("never", kIds);
  got = waiting.get_generated(never.manifest, "never", 2, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kNotFound);
  EXPECT_NE(std::string(got.error().what()).find("Timed out waiting for Mooncake key: never"),
            std::string::npos)
      << got.error().what();
  EXPECT_NE(std::string(got.error().what()).find("row 2, handle never"), std::string::npos);
  EXPECT_EQ(waiting.stats().timed_out, 1);
  EXPECT_GT(waiting.stats().polls, 3);
}

TEST(MooncakeTransfer, AKeyBeingWrittenIsReadAndRemovedOnceItsPutCompletes) {
  auto store = std::make_shared<MemoryStore>();
  const Sample s = sample_for("w", kIds);
  store->objects["w"] = s.object;
  store->writing["w"] = 2;
  MooncakeTransfer transfer(store, quick(5.0));
  Result<FetchedSample> got = transfer.get_generated(s.manifest, "w", 1, kIds);
  ASSERT_TRUE(got.ok()) << got.error().what();
  EXPECT_EQ(transfer.stats().polls, 2);
  {
    std::lock_guard lock(store->mutex);
    store->writing["w"] = 2;
  }
  transfer.remove("w");  // refused twice while "written", then removed
  std::lock_guard lock(store->mutex);
  EXPECT_EQ(store->objects.count("w"), 0u);
  EXPECT_EQ(transfer.stats().remove_errors, 0);
}

TEST(MooncakeTransfer, TheProducersErrorMarkerFailsTheReadEvenBesideTheData) {
  auto store = std::make_shared<MemoryStore>();
  const Sample s = sample_for("bad", kIds);
  store->objects["bad"] = s.object;
  store->objects["bad:error"] = R"({"error": "Non-finite producer tensor 'hidden_states'"})";
  store->objects["odd:error"] = "not json";
  MooncakeTransfer transfer(store, quick());
  Result<FetchedSample> got = transfer.get_generated(s.manifest, "bad", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kRuntime);
  EXPECT_NE(std::string(got.error().what())
                .find("Mooncake producer error for key=bad:error: Non-finite producer tensor"),
            std::string::npos)
      << got.error().what();
  const Sample odd = sample_for("odd", kIds);
  got = transfer.get_generated(odd.manifest, "odd", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(std::string(got.error().what()).find("Corrupt Mooncake json for key=odd:error"),
            std::string::npos);
  EXPECT_EQ(transfer.stats().error_markers, 2);
}

TEST(MooncakeTransfer, AnObjectOfAnotherSizeThanTheManifestsFails) {
  auto store = std::make_shared<MemoryStore>();
  const Sample s = sample_for("short", kIds);
  store->objects["short"] = s.object.substr(0, s.object.size() - 64);
  store->objects["long"] = s.object + std::string(64, '\0');
  MooncakeTransfer transfer(store, quick());
  Result<FetchedSample> got = transfer.get_generated(s.manifest, "short", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kFormat);
  EXPECT_NE(std::string(got.error().what())
                .find("payload size " + std::to_string(s.object.size() - 64) +
                      " doesn't match expected payload size " + std::to_string(s.object.size())),
            std::string::npos)
      << got.error().what();
  const Sample l = sample_for("long", kIds);
  got = transfer.get_generated(l.manifest, "long", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(
      std::string(got.error().what()).find("payload size " + std::to_string(s.object.size() + 64)),
      std::string::npos)
      << got.error().what();
  EXPECT_EQ(transfer.stats().wrong_size, 2);
}

TEST(MooncakeTransfer, TensorsThatDoNotMatchTheRowFail) {
  auto store = std::make_shared<MemoryStore>();
  const Sample s = sample_for("k", kIds);
  store->objects["k"] = s.object;
  MooncakeTransfer transfer(store, quick());
  std::vector<std::int64_t> other = kIds;
  other[2] = 99;
  Result<FetchedSample> got = transfer.get_generated(s.manifest, "k", 1, other);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kMismatch);
  EXPECT_NE(std::string(got.error().what()).find("at position 2 of 4"), std::string::npos);
  const std::vector<std::int64_t> shorter = {5, 9, 2};
  got = transfer.get_generated(s.manifest, "k", 1, shorter);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kMismatch);
  // The manifest says int8 hidden states: read, then refused.
  Json bent = Json::parse(s.manifest);
  bent["tensors"]["hidden_states"]["dtype"] = "torch.int8";
  bent["tensors"]["hidden_states"]["nbytes"] = 4 * kLayers * kHidden;
  got = transfer.get_generated(bent.dump(), "k", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kFormat);
  EXPECT_NE(std::string(got.error().what()).find("must be bf16/f16/f32"), std::string::npos);
  EXPECT_EQ(transfer.stats().bad_samples, 3);
  // Another key than the response's handle.
  got = transfer.get_generated(s.manifest, "other", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(std::string(got.error().what()).find("names another key, k"), std::string::npos);
}

TEST(MooncakeTransfer, RemovesTheKeyAndItsMarkerAndAMissingKeyIsNoError) {
  auto store = std::make_shared<MemoryStore>();
  store->objects["k"] = "x";
  store->objects["k:error"] = "{}";
  store->objects["j"] = "y";
  MooncakeTransfer transfer(store, quick());
  transfer.remove("k");
  transfer.remove("absent");
  {
    std::lock_guard lock(store->mutex);
    EXPECT_EQ(store->objects.size(), 1u);
    EXPECT_EQ(store->objects.count("j"), 1u);
    store->refuse_remove = true;
  }
  EXPECT_EQ(transfer.stats().removed, 1);
  EXPECT_THROW(transfer.remove("j"), Error);
  EXPECT_EQ(transfer.stats().remove_errors, 1);
  // The refused key is tried again (until key_wait): a store that comes back is left empty.
  {
    std::lock_guard lock(store->mutex);
    store->refuse_remove = false;
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (transfer.stats().removed < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  std::lock_guard lock(store->mutex);
  EXPECT_TRUE(store->objects.empty());
}

TEST(MooncakeTransfer, AKeyRemovedBeforeItsPutIsRemovedWhenItComes) {
  // A hedged request's loser answers, is removed through the transfer, and its producer puts the
  // object a moment later (hs-connectors' producer puts after answering): it must not stay.
  auto store = std::make_shared<MemoryStore>();
  MooncakeTransfer transfer(store, quick(60.0));
  const auto asked = std::chrono::steady_clock::now();
  transfer.remove("loser");
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 30s);  // hang guard: key_wait is 60 s
  const auto polled_by = std::chrono::steady_clock::now() + 10s;
  {
    // Looked for again a few times (the put comes later), then the put.
    std::unique_lock lock(store->mutex);
    store->entered.wait_until(lock, polled_by, [&] { return store->rounds >= 3; });
    store->objects["loser"] = "late";
  }
  const auto removed_by = std::chrono::steady_clock::now() + 10s;
  while (transfer.stats().orphans < 1 && std::chrono::steady_clock::now() < removed_by) {
    std::this_thread::yield();
  }
  EXPECT_EQ(transfer.stats().orphans, 1);
  EXPECT_EQ(transfer.stats().removed, 1);
  std::lock_guard lock(store->mutex);
  EXPECT_TRUE(store->objects.empty());
}

TEST(MooncakeTransfer, AStoreErrorFailsTheRoundsReadsAndTheNextRoundReadsAgain) {
  auto store = std::make_shared<MemoryStore>();
  const Sample s = sample_for("k", kIds);
  store->objects["k"] = s.object;
  MooncakeTransfer transfer(store, quick());
  (void)transfer.get_generated(s.manifest, "k", 1, kIds);  // registers the staging memory
  store->fail_rounds = 1;
  Result<FetchedSample> got = transfer.get_generated(s.manifest, "k", 1, kIds);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind(), ErrorKind::kRuntime);
  EXPECT_NE(std::string(got.error().what()).find("lost its master"), std::string::npos);
  EXPECT_TRUE(transfer.get_generated(s.manifest, "k", 1, kIds).ok());
  EXPECT_EQ(transfer.stats().store_errors, 1);
}

TEST(MooncakeTransfer, CancelEndsAWaitForAKeyAtOnceAndResumeReadsAgain) {
  auto store = std::make_shared<MemoryStore>();
  MooncakeTransfer transfer(store, quick(60.0));
  const Sample s = sample_for("late", kIds);
  std::atomic<bool> ended{false};
  std::thread waiter([&] {
    Result<FetchedSample> got = transfer.get_generated(s.manifest, "late", 1, kIds);
    EXPECT_FALSE(got.ok());
    EXPECT_NE(std::string(got.error().what()).find("cancelled"), std::string::npos);
    ended = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (transfer.stats().polls < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_GE(transfer.stats().polls, 2);
  const auto cancelled_at = std::chrono::steady_clock::now();
  transfer.cancel();
  waiter.join();
  EXPECT_TRUE(ended);
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled_at, 30s);  // hang guard: the wait is 60 s
  EXPECT_FALSE(transfer.get_generated(s.manifest, "late", 1, kIds).ok());
  transfer.resume();
  // The producer puts the cancelled read's object after all: it is removed once it is there.
  const Sample next = sample_for("next", kIds);
  {
    std::lock_guard lock(store->mutex);
    store->objects["late"] = s.object;
    store->objects["next"] = next.object;
  }
  EXPECT_TRUE(transfer.get_generated(next.manifest, "next", 1, kIds).ok());
  const auto removed_by = std::chrono::steady_clock::now() + 10s;
  while (transfer.stats().removed < 1 && std::chrono::steady_clock::now() < removed_by) {
    std::this_thread::yield();
  }
  EXPECT_EQ(transfer.stats().orphans, 1);
  std::lock_guard lock(store->mutex);
  EXPECT_EQ(store->objects.count("late"), 0u);
  EXPECT_EQ(store->objects.count("next"), 1u);
}

TEST(MooncakeManifest, RefusesWhatHsConnectorsRefuses) {
  const Sample s = sample_for("k", kIds);
  ASSERT_TRUE(parse_mooncake_manifest(s.manifest).ok());
  auto with = [&](const std::function<void(Json&)>& change) {
    Json j = Json::parse(s.manifest);
    change(j);
    return parse_mooncake_manifest(j.dump());
  };
  auto version = with([](Json& j) { j["version"] = 2; });
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.error().kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(version.error().what()).find("Mooncake manifest version 2 for key=k"),
            std::string::npos);
  EXPECT_EQ(with([](Json& j) { j.erase("version"); }).error().kind(), ErrorKind::kUnsupported);
  auto dtype = with([](Json& j) { j["tensors"]["hidden_states"]["dtype"] = "torch.float99"; });
  EXPECT_EQ(dtype.error().kind(), ErrorKind::kUnsupported);
  auto past = with([](Json& j) {
    j["tensors"]["hidden_states"]["offset"] = j["metadata"]["total_aligned_bytes"];
  });
  EXPECT_EQ(past.error().kind(), ErrorKind::kFormat);
  EXPECT_NE(std::string(past.error().what()).find("out of bounds"), std::string::npos);
  auto nbytes = with([](Json& j) { j["tensors"]["token_ids"]["nbytes"] = 8; });
  EXPECT_EQ(nbytes.error().kind(), ErrorKind::kFormat);
  auto overlap = with([](Json& j) { j["tensors"]["token_ids"]["offset"] = 0; });
  EXPECT_EQ(overlap.error().kind(), ErrorKind::kFormat);
  EXPECT_FALSE(with([](Json& j) { j["tensors"].erase("token_ids"); }).ok());
  EXPECT_FALSE(with([](Json& j) { j["tensors"]["hidden_states"]["shape"] = {-1, 2, 3}; }).ok());
  EXPECT_FALSE(with([](Json& j) {
                 j["tensors"]["hidden_states"]["shape"] = {1 << 30, 1 << 30, 1 << 30};
               }).ok());
  EXPECT_FALSE(parse_mooncake_manifest("{\"handle\":").ok());
  EXPECT_FALSE(parse_mooncake_manifest("[]").ok());
}

TEST(StagingPool, RegionsGoBackCoalescedAndTheChunkIsRegisteredOnce) {
  std::vector<std::uint64_t> chunks;
  StagingPool pool(1 << 20, [&](std::uint8_t*, std::uint64_t size) { chunks.push_back(size); });
  auto a = pool.allocate(300 << 10);
  auto b = pool.allocate(300 << 10);
  auto c = pool.allocate(300 << 10);
  EXPECT_EQ(chunks.size(), 1u);  // 2 MiB granules: one chunk holds all three
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a->data()) % StagingPool::kAlignment, 0u);
  b.reset();
  a.reset();
  // a and b coalesced: a region of both fits where they were, with no new chunk.
  auto d = pool.allocate(600 << 10);
  EXPECT_EQ(chunks.size(), 1u);
  EXPECT_EQ(pool.stats().regions, 2);
  // Larger than a chunk: a chunk of its own.
  auto big = pool.allocate(5 << 20);
  EXPECT_EQ(chunks.back(), std::uint64_t{6} << 20);
  EXPECT_EQ(pool.stats().registered_bytes, (std::uint64_t{2} << 20) + (std::uint64_t{6} << 20));
  std::memset(big->data(), 1, big->size());
  big.reset();
  c.reset();
  d.reset();
  EXPECT_EQ(pool.stats().used_bytes, 0u);
  EXPECT_GE(pool.stats().peak_used_bytes, std::uint64_t{5} << 20);
}

}  // namespace
}  // namespace draftfeed
