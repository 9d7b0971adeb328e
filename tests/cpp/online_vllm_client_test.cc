// VllmClient against a fake vLLM server on 127.0.0.1 (fake_vllm.h): the model check, the request,
// retries with backoff, what is not retried, the bound on requests in flight, cancel, and the
// options' one check. Every wait is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/online/vllm_client.h"
#include "fake_vllm.h"
#include "test_gate.h"

namespace draftfeed {
namespace {

using namespace std::chrono_literals;

const std::vector<std::int64_t> kIds = {11, 12, 13};

VllmClientOptions client_options(const LocalHttpServer& server) {
  VllmClientOptions options;
  options.endpoints = {server.url()};
  options.retry_backoff = 0.05s;
  return options;
}

TEST(OnlineVllmClient, ChecksTheModelOnceThenGenerates) {
  FakeVllm vllm;
  vllm.write = [](const auto&) { return std::string("/srv/hs/a.safetensors"); };
  LocalHttpServer server(vllm.handler());
  VllmClient client(client_options(server));
  for (int i = 0; i < 2; ++i) {
    const GenerationResult result = client.generate(kIds);
    ASSERT_TRUE(result.ok()) << result.message;
    EXPECT_EQ(result.handle, "/srv/hs/a.safetensors");
    EXPECT_EQ(result.attempts, 1);
    EXPECT_EQ(result.endpoint, server.url());
  }
  EXPECT_EQ(vllm.models.load(), 1);
  EXPECT_EQ(vllm.completions.load(), 2);
  const VllmClientStats stats = client.stats();
  EXPECT_EQ(stats.model, "verifier");
  EXPECT_EQ(stats.succeeded, 2);
  EXPECT_EQ(stats.model_checks, 1);
}

TEST(OnlineVllmClient, AnotherModelIsFatalBeforeAnyGeneration) {
  FakeVllm vllm;
  vllm.model = "someone-else";
  LocalHttpServer server(vllm.handler());
  VllmClientOptions options = client_options(server);
  options.model = "verifier";
  VllmClient client(options);
  const GenerationResult result = client.generate(kIds);
  EXPECT_EQ(result.failure, GenerationResult::Failure::kWrongModel);
  EXPECT_TRUE(result.fatal());
  EXPECT_NE(result.message.find("someone-else"), std::string::npos) << result.message;
  EXPECT_EQ(vllm.completions.load(), 0);
}

TEST(OnlineVllmClient, RetriesServerErrorsWithDoublingBackoff) {
  FakeVllm vllm;
  vllm.fail_first = 2;
  LocalHttpServer server(vllm.handler());
  VllmClient client(client_options(server));  // 0.05 s, then 0.1 s
  const auto start = std::chrono::steady_clock::now();
  const GenerationResult result = client.generate(kIds);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(result.ok()) << result.message;
  EXPECT_EQ(result.attempts, 3);
  EXPECT_GE(took, 0.15s);
  EXPECT_LT(took, 10s);
  EXPECT_EQ(client.stats().retries, 2);
  EXPECT_EQ(client.stats().http_retryable, 2);

  vllm.fail_first = 10;
  VllmClientOptions once = client_options(server);
  once.max_retries = 1;
  const GenerationResult exhausted = VllmClient(once).generate(kIds);
  EXPECT_EQ(exhausted.failure, GenerationResult::Failure::kExhausted);
  EXPECT_EQ(exhausted.attempts, 2);
  EXPECT_NE(exhausted.message.find("503"), std::string::npos) << exhausted.message;
}

TEST(OnlineVllmClient, AnInvalidResponseIsNotRetried) {
  FakeVllm vllm;
  vllm.wrong_ids = true;
  LocalHttpServer server(vllm.handler());
  VllmClient client(client_options(server));
  const GenerationResult result = client.generate(kIds);
  EXPECT_EQ(result.failure, GenerationResult::Failure::kInvalidResponse);
  EXPECT_EQ(result.problem, ResponseProblem::kPromptIdsMismatch);
  EXPECT_EQ(result.attempts, 1);
  EXPECT_EQ(vllm.completions.load(), 1);
}

TEST(OnlineVllmClient, KeepsAtMostFetchThreadsRequestsInFlight) {
  FakeVllm vllm;
  TestGate gate;
  vllm.hold = [&gate] { gate.pass(); };
  LocalHttpServer server(vllm.handler());
  VllmClientOptions options = client_options(server);
  options.fetch_threads = 2;
  VllmClient client(options);
  std::vector<std::thread> callers;
  std::vector<GenerationResult> results(5);
  for (std::size_t i = 0; i < results.size(); ++i) {
    callers.emplace_back([&, i] { results[i] = client.generate(kIds); });
  }
  ASSERT_TRUE(gate.wait_arrived(2));
  EXPECT_EQ(client.stats().in_flight, 2);  // the other three wait for a slot, not on the wire
  gate.release();
  for (auto& c : callers) c.join();
  for (const GenerationResult& r : results) EXPECT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(vllm.max_in_flight.load(), 2);
  EXPECT_EQ(client.stats().max_in_flight, 2);
}

TEST(OnlineVllmClient, CancelEndsARequestInFlightAndLaterOnesUntilResume) {
  FakeVllm vllm;
  TestGate gate;
  vllm.hold = [&gate] { gate.pass(); };
  LocalHttpServer server(vllm.handler());
  VllmClient client(client_options(server));
  GenerationResult result;
  std::thread caller([&] { result = client.generate(kIds); });
  ASSERT_TRUE(gate.wait_arrived(1));
  client.cancel();
  caller.join();  // ended by the cancel: the gate is still closed
  gate.release();
  EXPECT_EQ(result.failure, GenerationResult::Failure::kCancelled);
  EXPECT_EQ(client.generate(kIds).failure, GenerationResult::Failure::kCancelled);
  client.resume();
  EXPECT_TRUE(client.generate(kIds).ok());
}

TEST(OnlineVllmClient, OptionsAreCheckedOnceNamingTheField) {
  VllmClientOptions options;
  for (const int threads : {0, 4097}) {
    options.fetch_threads = threads;
    try {
      options.validate();
      FAIL() << "fetch_threads " << threads << " was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("fetch_threads"), std::string::npos);
    }
    EXPECT_THROW(VllmClient{options}, Error);
  }
  options.fetch_threads = 8;
  options.max_retries = -1;
  EXPECT_THROW(options.validate(), Error);
  options.max_retries = 0;
  options.endpoint.rest_after_failures = 0;
  EXPECT_THROW(options.validate(), Error);
  options.endpoint.rest_after_failures = 1;
  options.validate();
}

}  // namespace
}  // namespace draftfeed
