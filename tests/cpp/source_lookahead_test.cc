// The fetch lookahead over a fake inner source that records calls and can be held: rows are
// fetched in schedule order, at most `window` ahead, claimed once, started by the lookahead when
// the pipeline claims a queued one, dropped when replaced, and errors become fatal outcomes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/cancel_scope.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/source/lookahead_source.h"

namespace draftfeed {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Answers every row with an empty sample whose `tokens` is the row's length; with `held`, row 10
// waits until release(); row 13 throws.
class FakeSource : public SampleSource {
 public:
  FetchOutcome fetch(std::int64_t row, const IntArrayView& ids) override {
    {
      std::unique_lock lock(mutex);
      calls.push_back(row);
      changed.notify_all();
      changed.wait(lock, [&] { return !held || row != 10 || released; });
    }
    if (row == 13) throw std::runtime_error("row 13 exploded");
    FetchedSample sample;
    sample.hidden.tokens = ids.size();
    return FetchOutcome::ok(sample);
  }
  // Rows in `stored` are served by fetch_stored (a cache file), without a call.
  std::optional<FetchOutcome> fetch_stored(std::int64_t row, const IntArrayView& ids) override {
    if (!stored.contains(row)) return std::nullopt;
    FetchedSample sample;
    sample.hidden.tokens = ids.size();
    return FetchOutcome::ok(sample);
  }
  void release() {
    std::lock_guard lock(mutex);
    released = true;
    changed.notify_all();
  }
  // As the online source: interrupt() ends the held fetch at once.
  void interrupt() override {
    ++interrupts;
    release();
  }
  void resume() override { ++resumes; }
  // The lookahead runs this many threads.
  int blocking_fetches() const override { return threads; }
  std::vector<std::int64_t> wait_calls(std::size_t n) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, 5s, [&] { return calls.size() >= n; });
    return calls;
  }
  std::vector<std::int64_t> calls_now() {
    std::lock_guard lock(mutex);
    return calls;
  }

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::int64_t> calls;
  bool held = false;
  bool released = false;
  std::set<std::int64_t> stored;
  int threads = 1;
  std::atomic<int> interrupts{0};
  std::atomic<int> resumes{0};
};

// Waits (bounded) until `done` holds.
template <typename F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  return done();
}

class OnlineLookaheadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("draftfeed_lookahead_" + std::to_string(::getpid()));
    if (!fs::exists(dir_ / "state.json")) {
      SyntheticOptions options;
      options.rows = 40;
      options.min_len = 3;
      options.max_len = 9;
      write_synthetic_dataset(dir_.string(), options);
    }
    dataset_ = TokenDataset::open(dir_.string());
  }
  static void TearDownTestSuite() {
    fs::remove_all(fs::temp_directory_path() /
                   ("draftfeed_lookahead_" + std::to_string(::getpid())));
  }

  fs::path dir_;
  std::shared_ptr<const TokenDataset> dataset_;
};

TEST_F(OnlineLookaheadTest, FetchesAheadInOrderAndServesClaims) {
  auto fake = std::make_shared<FakeSource>();
  LookaheadSource ahead(fake, dataset_, {.window = 4});
  ahead.plan_rows({5, 2, 9, 7});
  // Four threads start the rows in the order given but record them in any order: the order
  // itself is FetchScheduleTest's.
  std::vector<std::int64_t> started = fake->wait_calls(4);
  std::sort(started.begin(), started.end());
  EXPECT_EQ(started, (std::vector<std::int64_t>{2, 5, 7, 9})) << "every row fetched ahead";
  for (const std::int64_t row : {5, 2, 9, 7}) {
    const FetchOutcome outcome = ahead.fetch(row, dataset_->input_ids(row));
    ASSERT_TRUE(outcome.sample.has_value());
    EXPECT_EQ(outcome.sample->hidden.tokens, dataset_->input_ids(row).size());
  }
  EXPECT_EQ(fake->calls.size(), 4u) << "claimed rows are not fetched again";
  const LookaheadStats stats = ahead.stats();
  EXPECT_EQ(stats.hits, 4);
  EXPECT_EQ(stats.inline_fetches, 0);
  EXPECT_EQ(stats.ready, 0);
}

TEST_F(OnlineLookaheadTest, StaysWithinTheWindow) {
  auto fake = std::make_shared<FakeSource>();
  fake->threads = 3;
  LookaheadSource ahead(fake, dataset_, {.window = 3});
  ahead.plan_rows({0, 1, 2, 3, 4, 5, 6, 7});
  fake->wait_calls(3);
  // Settled: the three rows fetched, and no thread may start a fourth (it would have by now).
  ASSERT_TRUE(eventually([&] { return ahead.settled(); }));
  EXPECT_EQ(fake->calls_now().size(), 3u) << "nothing starts while three rows wait to be claimed";
  EXPECT_EQ(ahead.stats().ready, 3);
  EXPECT_EQ(ahead.stats().queued, 5);
  const std::int64_t first = fake->calls_now()[0];
  ASSERT_TRUE(ahead.fetch(first, dataset_->input_ids(first)).sample);
  EXPECT_EQ(fake->wait_calls(4).size(), 4u) << "a claim makes room for the next row";
  std::vector<std::int64_t> calls = fake->calls_now();
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(std::unique(calls.begin(), calls.end()), calls.end()) << "no row fetched twice";
}

TEST_F(OnlineLookaheadTest, AClaimWaitsForARowUnderWayAndForAQueuedOneToStart) {
  auto fake = std::make_shared<FakeSource>();
  fake->held = true;
  LookaheadSource ahead(fake, dataset_, {.window = 8});
  ahead.plan_rows({10, 11, 12});
  fake->wait_calls(1);  // the only thread holds row 10; 11 and 12 are queued
  // Row 12 claimed before the lookahead gets to it: the lookahead starts it (not the consumer:
  // its plan order would take the slots from the schedule).
  std::atomic<bool> got12{false};
  std::thread claim12([&] {
    EXPECT_TRUE(ahead.fetch(12, dataset_->input_ids(12)).sample);
    got12 = true;
  });
  std::atomic<bool> claimed{false};
  std::thread claimer([&] {
    EXPECT_TRUE(ahead.fetch(10, dataset_->input_ids(10)).sample);
    claimed = true;
  });
  // Both claims reached their wait (where they would have returned had they not waited).
  const bool both_wait = eventually([&] { return ahead.stats().waiting_claims == 2; });
  EXPECT_TRUE(both_wait) << "waiting claims: " << ahead.stats().waiting_claims;
  EXPECT_FALSE(claimed.load()) << "the claim waits for the row under way";
  EXPECT_FALSE(got12.load()) << "the only thread is busy";
  fake->release();
  claimer.join();
  claim12.join();
  EXPECT_EQ(ahead.stats().waiting_claims, 0);
  EXPECT_TRUE(ahead.fetch(11, dataset_->input_ids(11)).sample);
  std::vector<std::int64_t> calls = fake->calls_now();
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<std::int64_t>{10, 11, 12})) << "no row fetched twice";
  const LookaheadStats stats = ahead.stats();
  EXPECT_EQ(stats.hits, 3);
  EXPECT_EQ(stats.inline_fetches, 0);
}

TEST_F(OnlineLookaheadTest, AClaimOfAStoredRowIsNotQueuedBehindAHeldThread) {
  auto fake = std::make_shared<FakeSource>();
  fake->held = true;
  fake->stored = {11};
  LookaheadSource ahead(fake, dataset_, {.window = 8});
  ahead.plan_rows({10, 11, 12});
  fake->wait_calls(1);  // the only thread holds row 10 (a stalled request); 11 and 12 are queued
  // Row 11 is in the cache: the claim reads it now, without waiting for the held thread.
  auto claim =
      std::async(std::launch::async, [&] { return ahead.fetch(11, dataset_->input_ids(11)); });
  const bool served = claim.wait_for(10s) == std::future_status::ready;
  if (!served) fake->release();
  ASSERT_TRUE(served) << "the claim of a stored row waited for the held thread";
  const FetchOutcome outcome = claim.get();
  ASSERT_TRUE(outcome.sample.has_value());
  EXPECT_EQ(outcome.sample->hidden.tokens, dataset_->input_ids(11).size());
  EXPECT_EQ(ahead.stats().stored_reads, 1);
  EXPECT_EQ(ahead.stats().queued, 1) << "row 11 left the queue; 12 is still there";
  fake->release();
  EXPECT_TRUE(ahead.fetch(10, dataset_->input_ids(10)).sample);
  EXPECT_TRUE(ahead.fetch(12, dataset_->input_ids(12)).sample);
  std::vector<std::int64_t> calls = fake->wait_calls(2);
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<std::int64_t>{10, 12})) << "row 11 was not requested";
}

TEST_F(OnlineLookaheadTest, ReplacingTheQueueDropsUnclaimedRows) {
  auto fake = std::make_shared<FakeSource>();
  fake->threads = 2;
  LookaheadSource ahead(fake, dataset_, {.window = 8});
  ahead.plan_rows({1, 2, 3});
  fake->wait_calls(3);
  ASSERT_TRUE(eventually([&] { return ahead.settled(); }));  // the three fetched
  ahead.plan_rows({20, 21});
  fake->wait_calls(5);
  ASSERT_TRUE(eventually([&] { return ahead.settled(); }));
  EXPECT_EQ(ahead.stats().discarded, 3);
  // A row of the old queue is fetched again when claimed.
  EXPECT_TRUE(ahead.fetch(1, dataset_->input_ids(1)).sample);
  EXPECT_EQ(fake->calls_now().size(), 6u);
  EXPECT_THROW(ahead.plan_rows({40}), Error) << "row 40 is outside the 40-row dataset";
}

TEST_F(OnlineLookaheadTest, TheNextPlanStartsAfterTheCurrentOneAndServesTheNextEpoch) {
  auto fake = std::make_shared<FakeSource>();
  LookaheadSource ahead(fake, dataset_, {.window = 8});
  ahead.plan(0, {{1}, {2}}, /*next=*/{{3}, {1}});
  EXPECT_EQ(fake->wait_calls(4).size(), 4u);
  std::vector<std::int64_t> first_two(fake->calls.begin(), fake->calls.begin() + 2);
  std::sort(first_two.begin(), first_two.end());
  EXPECT_EQ(first_two, (std::vector<std::int64_t>{1, 2})) << "this epoch's rows first";
  for (const std::int64_t row : {1, 2})
    EXPECT_TRUE(ahead.fetch(row, dataset_->input_ids(row)).sample);
  EXPECT_EQ(ahead.stats().next_plan_started, 2);
  // The next epoch: its rows fetched ahead are kept and claimed without a new request.
  ahead.plan(0, {{3}, {1}, {4}});
  for (const std::int64_t row : {3, 1, 4})
    EXPECT_TRUE(ahead.fetch(row, dataset_->input_ids(row)).sample);
  EXPECT_EQ(fake->calls.size(), 5u) << "only row 4 was fetched for the second epoch";
  EXPECT_EQ(ahead.stats().discarded, 0);
}

TEST_F(OnlineLookaheadTest, AnErrorBecomesAFatalOutcome) {
  auto fake = std::make_shared<FakeSource>();
  LookaheadSource ahead(fake, dataset_, {.window = 2});
  ahead.plan_rows({13});
  fake->wait_calls(1);  // the lookahead thread has it (a claim now waits for its outcome)
  const FetchOutcome outcome = ahead.fetch(13, dataset_->input_ids(13));
  EXPECT_FALSE(outcome.sample.has_value());
  EXPECT_TRUE(outcome.fatal);
  EXPECT_NE(outcome.message.find("row 13 exploded"), std::string::npos) << outcome.message;
}

TEST_F(OnlineLookaheadTest, DestructionInterruptsTheInnerSource) {
  auto fake = std::make_shared<FakeSource>();
  fake->held = true;
  {
    LookaheadSource ahead(fake, dataset_, {.window = 2});
    ahead.plan_rows({10, 1});
    fake->wait_calls(1);  // row 10 is held: only the interrupt lets the destructor join
  }
  EXPECT_EQ(fake->interrupts.load(), 1);
  EXPECT_EQ(fake->resumes.load(), 1) << "the inner source may outlive the lookahead";
}

TEST_F(OnlineLookaheadTest, InterruptDropsTheQueueAndResumeWaitsForIdleThreads) {
  auto fake = std::make_shared<FakeSource>();
  fake->held = true;
  LookaheadSource ahead(fake, dataset_, {.window = 4});
  ahead.plan_rows({10, 1, 2, 3});
  EXPECT_EQ(fake->wait_calls(1), std::vector<std::int64_t>({10}));
  ahead.interrupt();  // the pipeline stops mid-epoch
  ahead.resume();     // returns once row 10's fetch has ended
  EXPECT_EQ(fake->interrupts.load(), 1);
  EXPECT_EQ(fake->resumes.load(), 1);
  const LookaheadStats stats = ahead.stats();
  EXPECT_EQ(stats.queued, 0) << "rows 1-3 were dropped from the queue";
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.ready, 0) << "row 10's result belongs to the stopped epoch";
  // The next epoch fetches normally.
  ahead.plan_rows({5, 6});
  EXPECT_EQ(fake->wait_calls(3), std::vector<std::int64_t>({10, 5, 6}));
  EXPECT_TRUE(ahead.fetch(6, dataset_->input_ids(6)).sample);
}

}  // namespace
}  // namespace draftfeed

namespace draftfeed {
namespace {

// Rows answer at once, but for `slow_row`: its fetches in `stall_calls` (0: the first, 1: the
// second) wait until their task is cancelled (cancel_scope.h) or `stall_for` passes; the others
// take `slow_row_takes`.
class StallingSource : public SampleSource {
 public:
  FetchOutcome fetch(std::int64_t row, const IntArrayView& ids) override {
    int call = 0;
    {
      std::lock_guard lock(mutex);
      if (row == slow_row) call = slow_calls++;
    }
    if (row == slow_row) {
      const bool stall =
          std::find(stall_calls.begin(), stall_calls.end(), call) != stall_calls.end();
      const auto until = std::chrono::steady_clock::now() + (stall ? stall_for : slow_row_takes);
      while (std::chrono::steady_clock::now() < until) {
        if (CancelScope::cancelled()) {
          std::lock_guard lock(mutex);
          cancelled_calls.push_back(call);
          return FetchOutcome::dropped(DropReason::kGenerationFailed, "cancelled");
        }
        std::this_thread::sleep_for(2ms);
      }
    }
    FetchedSample sample;
    sample.hidden.tokens = ids.size();
    sample.hidden.layers = row == slow_row ? 100 + call : 0;  // which call answered
    return FetchOutcome::ok(sample);
  }
  FetchOutcome fetch_not_stored(std::int64_t row, const IntArrayView& ids) override {
    return fetch(row, ids);
  }
  int blocking_fetches() const override { return 2; }
  bool cancelled_fetches_leave_data() const override { return leaves_data; }

  bool leaves_data = false;
  std::int64_t slow_row = 3;
  std::vector<int> stall_calls{0};
  std::chrono::steady_clock::duration stall_for = 20s;
  std::chrono::steady_clock::duration slow_row_takes = 0s;
  std::mutex mutex;
  int slow_calls = 0;
  std::vector<int> cancelled_calls;
};

// Plans rows 0-11 and claims each but `skip` (each must come with a sample).
void plan_and_claim_all_but(LookaheadSource& ahead, const TokenDataset& dataset,
                            std::int64_t skip) {
  std::vector<std::int64_t> rows(12);
  for (std::int64_t r = 0; r < 12; ++r) rows[static_cast<std::size_t>(r)] = r;
  ahead.plan_rows(rows);
  for (std::int64_t r = 0; r < 12; ++r) {
    if (r == skip) continue;
    ASSERT_TRUE(ahead.fetch(r, dataset.input_ids(r)).sample.has_value()) << "row " << r;
  }
}

// Waits (5 s at most) until no fetch of the lookahead runs; returns its stats then.
LookaheadStats stats_once_idle(LookaheadSource& ahead) {
  for (int i = 0; i < 500 && ahead.stats().running > 0; ++i) std::this_thread::sleep_for(10ms);
  return ahead.stats();
}

double seconds_to_claim(LookaheadSource& ahead, const TokenDataset& dataset, std::int64_t row,
                        FetchOutcome& outcome) {
  const auto start = std::chrono::steady_clock::now();
  outcome = ahead.fetch(row, dataset.input_ids(row));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_F(OnlineLookaheadTest, AStalledFetchIsAskedAgainByAnIdleThreadAndTheLoserIsCancelled) {
  auto fake = std::make_shared<StallingSource>();
  LookaheadSource ahead(
      fake, dataset_,
      {.window = 16, .hedge = {.factor = 2, .min_wait = std::chrono::duration<double>(0.05)}});
  plan_and_claim_all_but(ahead, *dataset_, fake->slow_row);
  FetchOutcome outcome;
  // 20 s if it waits out the stall; a margin of half that for a loaded machine.
  EXPECT_LT(seconds_to_claim(ahead, *dataset_, fake->slow_row, outcome), 10.0)
      << "the claim waited for the stalled fetch: it was not hedged";
  ASSERT_TRUE(outcome.sample.has_value()) << outcome.message;
  EXPECT_EQ(outcome.sample->hidden.layers, 101) << "the second fetch's sample";
  // The first fetch sees its cancel within its poll.
  const LookaheadStats stats = stats_once_idle(ahead);
  EXPECT_EQ(stats.running, 0) << "the stalled first fetch was not cancelled";
  EXPECT_EQ(stats.memory.hedges, 1);
  EXPECT_EQ(stats.memory.hedges_won, 1);
  std::lock_guard lock(fake->mutex);
  EXPECT_EQ(fake->slow_calls, 2) << "one hedge per row";
  EXPECT_EQ(fake->cancelled_calls, std::vector<int>{0});
}

TEST_F(OnlineLookaheadTest, WhenTheFirstFetchEndsFirstTheHedgeIsCancelled) {
  auto fake = std::make_shared<StallingSource>();
  fake->stall_calls = {1};       // the hedge stalls
  fake->slow_row_takes = 300ms;  // the first is slow, not stuck
  LookaheadSource ahead(
      fake, dataset_,
      {.window = 16, .hedge = {.factor = 2, .min_wait = std::chrono::duration<double>(0.05)}});
  plan_and_claim_all_but(ahead, *dataset_, fake->slow_row);
  FetchOutcome outcome;
  EXPECT_LT(seconds_to_claim(ahead, *dataset_, fake->slow_row, outcome), 10.0);
  ASSERT_TRUE(outcome.sample.has_value()) << outcome.message;
  EXPECT_EQ(outcome.sample->hidden.layers, 100) << "the first fetch's sample";
  const LookaheadStats stats = stats_once_idle(ahead);
  EXPECT_EQ(stats.running, 0) << "the stalled hedge was not cancelled";
  EXPECT_EQ(stats.memory.hedges, 1);
  EXPECT_EQ(stats.memory.hedges_won, 0);
  EXPECT_EQ(stats.memory.hedges_lost, 1);
  std::lock_guard lock(fake->mutex);
  EXPECT_EQ(fake->cancelled_calls, std::vector<int>{1});
}

TEST_F(OnlineLookaheadTest, ALoserWhoseCancelWouldLeaveDataRunsToItsEnd) {
  // A Mooncake transfer: a request cancelled as its answer comes leaves the sample in the store
  // under a key only that answer names. The loser runs on, so the source reads and removes it.
  auto fake = std::make_shared<StallingSource>();
  fake->leaves_data = true;
  fake->stall_for = 1s;  // the first fetch is slow enough to be hedged, and ends by itself
  LookaheadSource ahead(
      fake, dataset_,
      {.window = 16, .hedge = {.factor = 2, .min_wait = std::chrono::duration<double>(0.05)}});
  plan_and_claim_all_but(ahead, *dataset_, fake->slow_row);
  FetchOutcome outcome;
  EXPECT_LT(seconds_to_claim(ahead, *dataset_, fake->slow_row, outcome), 10.0);
  ASSERT_TRUE(outcome.sample.has_value()) << outcome.message;
  EXPECT_EQ(outcome.sample->hidden.layers, 101) << "the hedge's sample";
  const LookaheadStats stats = stats_once_idle(ahead);  // the loser ends by itself after 1 s
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.memory.hedges_won, 1);
  std::lock_guard lock(fake->mutex);
  EXPECT_TRUE(fake->cancelled_calls.empty()) << "the loser was cancelled";
}

TEST_F(OnlineLookaheadTest, NoHedgeWhenTheFactorIsZero) {
  auto fake = std::make_shared<StallingSource>();
  fake->stall_for = 1s;
  LookaheadSource ahead(
      fake, dataset_,
      {.window = 16, .hedge = {.factor = 0, .min_wait = std::chrono::duration<double>(0)}});
  plan_and_claim_all_but(ahead, *dataset_, -1);
  EXPECT_EQ(ahead.stats().memory.hedges, 0);
  std::lock_guard lock(fake->mutex);
  EXPECT_EQ(fake->slow_calls, 1);
}

}  // namespace
}  // namespace draftfeed
