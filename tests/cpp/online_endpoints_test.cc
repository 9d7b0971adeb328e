// Endpoint choice without a network: least requests in flight, rotation among equals, resting a
// failing endpoint and bringing it back, and the fallback when every endpoint rests.
#include <gtest/gtest.h>

#include <chrono>
#include <iterator>
#include <list>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/online/endpoints.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kUrls = {"http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1/",
                                        "http://127.0.0.1:3/v1"};

EndpointOptions options(int rest_after, std::chrono::duration<double> rest) {
  EndpointOptions o;
  o.rest_after_failures = rest_after;
  o.rest_time = rest;
  return o;
}

TEST(OnlineEndpointsTest, SpreadsRequestsOverTheLeastBusy) {
  EndpointSet set(kUrls, options(3, 1s));
  std::list<EndpointSet::Lease> leases;
  std::set<std::string> used;
  for (int i = 0; i < 3; ++i) {
    leases.push_back(set.acquire());
    used.insert(leases.back().endpoint().pool.base_url());
  }
  EXPECT_EQ(used.size(), 3u) << "three requests in flight must go to three endpoints";
  // Trailing slashes are dropped.
  EXPECT_TRUE(used.count("http://127.0.0.1:2/v1"));
  // Free the second endpoint: it is now the only one with nothing in flight.
  const auto second = std::next(leases.begin());
  const std::string freed = second->endpoint().pool.base_url();
  leases.erase(second);
  EXPECT_EQ(set.acquire().endpoint().pool.base_url(), freed);
  for (const auto& s : set.stats()) EXPECT_GE(s.requests, 1);
}

TEST(OnlineEndpointsTest, RotatesAmongEquallyBusyEndpoints) {
  EndpointSet set(kUrls, options(3, 1s));
  std::set<std::string> used;
  for (int i = 0; i < 3; ++i) used.insert(set.acquire().endpoint().pool.base_url());
  EXPECT_EQ(used.size(), 3u) << "sequential requests must not all go to the first endpoint";
}

TEST(OnlineEndpointsTest, RestsAFailingEndpointAndBringsItBack) {
  const auto rest = 1s;
  EndpointSet set({kUrls[0], kUrls[1]}, options(2, rest));
  // Fail the first endpoint twice in a row.
  auto rested_at = std::chrono::steady_clock::now();
  for (int failures = 0; failures < 2;) {
    auto lease = set.acquire();
    if (lease.endpoint().pool.base_url() == kUrls[0]) {
      rested_at = std::chrono::steady_clock::now();  // no later than the rest began
      lease.report(false);
      ++failures;
    } else {
      lease.report(true);
    }
  }
  auto stats = set.stats();
  EXPECT_EQ(stats[0].rests, 1);
  EXPECT_EQ(stats[0].failures, 2);
  // While it rests it is skipped. Checked only for the choices made while it still rested (known
  // afterwards): a loaded machine may let the rest end first, which is no failure of the set.
  int checked = 0;
  for (int i = 0; i < 10; ++i) {
    const std::string chosen = set.acquire().endpoint().pool.base_url();
    if (!set.stats()[0].resting) break;
    EXPECT_EQ(chosen, "http://127.0.0.1:2/v1")
        << "a resting endpoint must be skipped while another works";
    ++checked;
  }
  EXPECT_GE(checked, 1) << "the rest of " << rest.count() << " s ended before one acquire";
  // It comes back once its rest is over, not before.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (set.stats()[0].resting && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(set.stats()[0].resting) << "still resting 30 s after a rest of 1 s";
  EXPECT_GE(std::chrono::steady_clock::now() - rested_at, rest) << "back before its rest ended";
  std::set<std::string> used;
  for (int i = 0; i < 4; ++i) used.insert(set.acquire().endpoint().pool.base_url());
  EXPECT_EQ(used.size(), 2u) << "a rested endpoint is tried again after its rest";
}

TEST(OnlineEndpointsTest, ASuccessResetsTheFailureRun) {
  EndpointSet set({kUrls[0]}, options(2, 10s));
  set.acquire().report(false);
  set.acquire().report(true);
  set.acquire().report(false);
  EXPECT_FALSE(set.stats()[0].resting) << "failures separated by a success are not a run";
  set.acquire().report(false);
  EXPECT_TRUE(set.stats()[0].resting);
}

TEST(OnlineEndpointsTest, WhenAllRestTheOneBackSoonestIsUsed) {
  EndpointSet set({kUrls[0], kUrls[1]}, options(1, 10s));
  {
    auto a = set.acquire();
    auto b = set.acquire();
    a.report(false);  // rests first: back first
    std::this_thread::sleep_for(20ms);
    b.report(false);
  }
  const auto stats = set.stats();
  EXPECT_TRUE(stats[0].resting && stats[1].resting);
  EXPECT_EQ(stats[0].rests + stats[1].rests, 2);
  auto lease = set.acquire();
  EXPECT_EQ(lease.endpoint().pool.base_url(), kUrls[0]);
}

TEST(OnlineEndpointsTest, RefusesBadConfigurations) {
  EXPECT_THROW(EndpointSet({}, options(3, 1s)), Error);
  EXPECT_THROW(EndpointSet({"localhost:8000/v1"}, options(3, 1s)), Error);
  EXPECT_THROW(EndpointSet({kUrls[0]}, options(0, 1s)), Error);
  try {
    EndpointSet({"ftp://x"}, options(3, 1s));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ftp://x"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace draftfeed
