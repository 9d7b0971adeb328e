// The fetch schedule and its service-time model with made-up service times: an epoch simulated
// on a few slots ends near the ideal (total service / slots, or the longest request) when a long
// request sits late in the plan, known from its history or from its prompt's length, where plan
// order ends a long request's time after every other slot went idle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <queue>
#include <random>
#include <vector>

#include "draftfeed/read_ahead/fetch_schedule.h"
#include "draftfeed/read_ahead/service_time_model.h"

namespace draftfeed {
namespace {

constexpr int kSlots = 4;

// 40 rows in 10 batches of 4, in plan order; row r has tokens[r] tokens.
FetchSchedule::Batches plan_of(const std::vector<std::int64_t>& tokens) {
  FetchSchedule::Batches batches(tokens.size() / 4);
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    batches[r / 4].push_back({static_cast<std::int64_t>(r), tokens[r]});
  }
  return batches;
}

// Runs the plan on kSlots slots, each free slot starting the next row `next_row()` gives;
// returns when the last one ends.
double makespan(const std::vector<double>& seconds, const std::function<std::int64_t()>& next_row) {
  std::priority_queue<double, std::vector<double>, std::greater<>> ends;
  for (int s = 0; s < kSlots; ++s) ends.push(0);
  double last = 0;
  for (std::size_t n = 0; n < seconds.size(); ++n) {
    const double now = ends.top();
    ends.pop();
    const double end = now + seconds[static_cast<std::size_t>(next_row())];
    last = std::max(last, end);
    ends.push(end);
  }
  return last;
}

double scheduled(const std::vector<double>& seconds, const std::vector<std::int64_t>& tokens,
                 const ServiceTimeModel& model) {
  FetchSchedule schedule(kSlots);
  schedule.set_plan(0, plan_of(tokens), {}, model);
  return makespan(seconds, [&] { return schedule.pick([](std::int64_t) { return true; })->row; });
}

double plan_order(const std::vector<double>& seconds) {
  std::int64_t row = 0;
  return makespan(seconds, [&] { return row++; });
}

double ideal(const std::vector<double>& seconds) {
  double total = 0;
  for (const double s : seconds) total += s;
  return std::max(total / kSlots, *std::max_element(seconds.begin(), seconds.end()));
}

TEST(FetchScheduleTest, ALongRequestLateInThePlanStartsEarlyFromItsHistory) {
  // As the keyed lognormal server: times have nothing to do with the length, but repeat.
  std::mt19937 rng(7);
  std::lognormal_distribution<double> service(std::log(0.25), 0.5);
  std::vector<std::int64_t> tokens(40, 100);
  std::vector<double> seconds(40);
  for (double& s : seconds) s = service(rng);
  seconds[38] = 3.0;  // in the last batch
  ServiceTimeModel model;
  for (std::int64_t r = 0; r < 40; ++r) model.observe(r, tokens[r], seconds[r]);  // last epoch
  EXPECT_GT(plan_order(seconds), 1.2 * ideal(seconds)) << "the case the schedule is for";
  EXPECT_LE(scheduled(seconds, tokens, model), 1.05 * ideal(seconds));
}

TEST(FetchScheduleTest, ALongPromptLateInThePlanStartsEarlyBeforeAnyHistory) {
  // As a vLLM server's prefill: time grows with the prompt; nothing was fetched yet.
  std::vector<std::int64_t> tokens(40);
  std::vector<double> seconds(40);
  for (std::size_t r = 0; r < 40; ++r) {
    tokens[r] = 40 + static_cast<std::int64_t>((r * 37) % 60);
    seconds[r] = 0.01 * static_cast<double>(tokens[r]);
  }
  tokens[37] = 1500;  // in the last batch
  seconds[37] = 0.01 * 1500;
  const ServiceTimeModel nothing_seen;
  EXPECT_GT(plan_order(seconds), 1.2 * ideal(seconds));
  EXPECT_LE(scheduled(seconds, tokens, nothing_seen), 1.05 * ideal(seconds));
}

TEST(FetchScheduleTest, TiersClaimsAndOccurrences) {
  const ServiceTimeModel model;
  FetchSchedule schedule(1);
  // The current plan's rows 0-1, the next plan's rows 1 and 2 (row 2 much longer).
  schedule.set_plan(0, {{{0, 10}}, {{1, 10}}}, {{{1, 10}, {2, 1000}}}, model);
  EXPECT_EQ(schedule.occurrences(1), 2);
  const auto always = [](std::int64_t) { return true; };
  const auto never = [](std::int64_t) { return false; };
  EXPECT_FALSE(schedule.pick(never).has_value()) << "nothing fits";
  EXPECT_TRUE(schedule.claim(1));
  const auto claimed = schedule.pick(never);
  ASSERT_TRUE(claimed.has_value()) << "a claimed row starts whatever fits";
  EXPECT_EQ(claimed->row, 1);
  EXPECT_FALSE(claimed->next) << "the current plan's occurrence is claimed first";
  EXPECT_EQ(schedule.pick(always)->row, 0);
  const auto next = schedule.pick(always);
  ASSERT_TRUE(next.has_value());
  EXPECT_TRUE(next->next) << "the next plan only once the current one has started";
  EXPECT_EQ(next->row, 2) << "longest first within the next plan's due time";
  EXPECT_TRUE(schedule.mark_started(1));
  EXPECT_FALSE(schedule.pick(always).has_value());
  EXPECT_FALSE(schedule.claim(5)) << "row 5 is in no plan";
}

TEST(ServiceTimeModelTest, TrustsHistoryWhenTimesRepeatAndTheLengthWhenTheyDoNot) {
  std::mt19937 rng(3);
  std::lognormal_distribution<double> tail(0.0, 1.0);
  std::uniform_int_distribution<std::int64_t> length(32, 256);
  std::vector<std::int64_t> tokens(200);
  for (auto& t : tokens) t = length(rng);

  ServiceTimeModel keyed;  // each row's time is its own, the same at every fetch
  std::vector<double> own(200);
  for (double& s : own) s = 0.25 * tail(rng);
  ServiceTimeModel prefill;  // the time grows with the tokens, times a tail drawn anew
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (std::int64_t r = 0; r < 200; ++r) {
      keyed.observe(r, tokens[r], own[r]);
      prefill.observe(r, tokens[r], 0.002 * static_cast<double>(tokens[r]) * tail(rng));
    }
  }
  EXPECT_TRUE(keyed.trusts_history());
  EXPECT_DOUBLE_EQ(keyed.predict(5, tokens[5]), own[5]);
  EXPECT_LT(keyed.tail_factor(), 1.01) << "exact predictions need no slack";
  EXPECT_FALSE(prefill.trusts_history());
  EXPECT_NEAR(prefill.predict(7, 200) / prefill.predict(7, 100), 2.0, 0.5)
      << "time proportional to the tokens";
  EXPECT_GT(prefill.tail_factor(), 3.0) << "a lognormal tail with sigma 1: about exp(1.6)";
}

}  // namespace
}  // namespace draftfeed
