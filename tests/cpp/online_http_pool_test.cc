// HttpPool against a real HTTP server on 127.0.0.1 (local_http_server.h): requests and replies as
// sent, keep-alive reuse counted by the server, the body bound, timeouts, cancel and resume, a port
// nobody listens on. Every wait is bounded; a held request is released before the server goes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "draftfeed/common/cancel_scope.h"
#include "draftfeed/online/http_pool.h"
#include "local_http_server.h"
#include "test_gate.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

TEST(OnlineHttpPool, SendsTheRequestAndReturnsTheReply) {
  HttpRequestSeen seen;
  LocalHttpServer server([&seen](const HttpRequestSeen& request) {
    seen = request;
    return HttpReply{request.method == "POST" ? 201 : 404, "{\"echo\":" + request.body + "}"};
  });
  HttpPool pool(server.url(), {});
  const HttpResult posted = pool.post_json("/completions", "[1,2,3]", 10s);
  ASSERT_EQ(posted.outcome, HttpResult::Outcome::kResponse) << posted.error;
  EXPECT_EQ(posted.status, 201);
  EXPECT_EQ(posted.body, "{\"echo\":[1,2,3]}");
  EXPECT_EQ(seen.method, "POST");
  EXPECT_EQ(seen.path, "/v1/completions");
  EXPECT_NE(seen.headers.find("content-type: application/json"), std::string::npos);
  const HttpResult got = pool.get("/models", 10s);
  ASSERT_EQ(got.outcome, HttpResult::Outcome::kResponse) << got.error;
  EXPECT_EQ(got.status, 404);  // any status is a response; retrying is the client's decision
  EXPECT_EQ(seen.method, "GET");
  EXPECT_EQ(seen.path, "/v1/models");
}

TEST(OnlineHttpPool, KeepAliveReusesOneConnection) {
  for (const bool keep_alive : {true, false}) {
    LocalHttpServer server([](const HttpRequestSeen&) { return HttpReply{200, "{}"}; });
    HttpPoolOptions options;
    options.keep_alive = keep_alive;
    HttpPool pool(server.url(), options);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(pool.get("/models", 10s).outcome, HttpResult::Outcome::kResponse);
    }
    EXPECT_EQ(pool.connections_opened(), keep_alive ? 1 : 3);
    EXPECT_EQ(server.connections_accepted(), keep_alive ? 1 : 3);
    EXPECT_EQ(server.requests(), 3);
  }
}

TEST(OnlineHttpPool, RefusesABodyPastTheBound) {
  LocalHttpServer server([](const HttpRequestSeen&) {
    return HttpReply{200, std::string(5000, 'x')};
  });
  HttpPoolOptions options;
  options.max_body_bytes = 4096;
  HttpPool pool(server.url(), options);
  const HttpResult result = pool.get("/models", 10s);
  EXPECT_EQ(result.outcome, HttpResult::Outcome::kTooLarge);
  EXPECT_TRUE(result.body.empty());
  EXPECT_NE(result.error.find("4096"), std::string::npos) << result.error;
  options.max_body_bytes = 5000;
  EXPECT_EQ(HttpPool(server.url(), options).get("/models", 10s).body.size(), 5000u);
}

TEST(OnlineHttpPool, GivesUpAfterTheTimeout) {
  TestGate gate;
  LocalHttpServer server([&gate](const HttpRequestSeen&) {
    gate.pass();
    return HttpReply{200, "{}"};
  });
  HttpPool pool(server.url(), {});
  const auto start = std::chrono::steady_clock::now();
  const HttpResult result = pool.get("/models", 0.2s);
  const auto took = std::chrono::steady_clock::now() - start;
  gate.release();
  EXPECT_EQ(result.outcome, HttpResult::Outcome::kTimeout) << result.error;
  EXPECT_GE(took, 0.19s);
  EXPECT_LT(took, 10s);
}

TEST(OnlineHttpPool, CancelEndsATransferInFlightUntilResume) {
  TestGate gate;
  LocalHttpServer server([&gate](const HttpRequestSeen& request) {
    if (request.path == "/v1/slow") gate.pass();
    return HttpReply{200, "{}"};
  });
  HttpPool pool(server.url(), {});
  HttpResult result;
  std::thread request([&] { result = pool.get("/slow", 30s); });
  ASSERT_TRUE(gate.wait_arrived(1));
  pool.cancel();
  request.join();  // ends without the server answering: the gate is still closed
  gate.release();
  EXPECT_EQ(result.outcome, HttpResult::Outcome::kCancelled);
  EXPECT_EQ(pool.get("/fast", 10s).outcome, HttpResult::Outcome::kCancelled);
  pool.resume();
  EXPECT_EQ(pool.get("/fast", 10s).outcome, HttpResult::Outcome::kResponse);
}

TEST(OnlineHttpPool, ACancelScopeEndsItsThreadsTransferAlone) {
  TestGate gate;
  LocalHttpServer server([&gate](const HttpRequestSeen& request) {
    if (request.path == "/v1/slow") gate.pass();
    return HttpReply{200, "{}"};
  });
  HttpPool pool(server.url(), {});
  std::atomic<bool> cancelled{false};
  std::promise<HttpResult> done;
  std::thread request([&] {
    const CancelScope scope(&cancelled);
    done.set_value(pool.get("/slow", 30s));
  });
  ASSERT_TRUE(gate.wait_arrived(1));
  cancelled = true;
  std::future<HttpResult> result = done.get_future();
  // libcurl's progress callback, which looks at the flag, comes about every 0.15 s while it
  // waits: 10 s is a loaded machine's margin. Past it, the gate is opened so the thread can end.
  const bool ended = result.wait_for(10s) == std::future_status::ready;
  gate.release();
  request.join();
  ASSERT_TRUE(ended) << "the cancelled task's transfer went on";
  EXPECT_EQ(result.get().outcome, HttpResult::Outcome::kCancelled);
  EXPECT_FALSE(pool.cancelled()) << "the pool itself is not cancelled";
  EXPECT_EQ(pool.get("/fast", 10s).outcome, HttpResult::Outcome::kResponse);
}

TEST(OnlineHttpPool, APortNobodyListensOnIsATransportError) {
  int port = 0;
  {
    LocalHttpServer server([](const HttpRequestSeen&) { return HttpReply{}; });
    port = server.port();
  }  // closed: connections to it are refused
  HttpPool pool("http://127.0.0.1:" + std::to_string(port) + "/v1", {});
  const HttpResult result = pool.get("/models", 10s);
  EXPECT_EQ(result.outcome, HttpResult::Outcome::kTransport);
  EXPECT_FALSE(result.error.empty());
}

}  // namespace
}  // namespace draftfeed
