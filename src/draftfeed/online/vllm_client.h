// A vLLM client for hidden-state generation (docs/protocol.md, steps 1-5): the `/models` check, the
// completions (or chat) request, response checks, per-attempt timeouts, retries with exponential
// backoff, several endpoints (endpoints.h) and a bound on requests in flight.
//
// Retried (up to `max_retries` extra attempts, sleeping retry_backoff * 2^(attempt-1) before each
// retry: 2, 4, 8 s by default, as the reference): transport errors, timeouts, HTTP 5xx, 408, 429.
// Not retried: an invalid response (response_problem_name), a body past the size bound, another
// HTTP status (a 4xx says the request itself is wrong). A retry may go to another endpoint.
//
// The model check runs once per endpoint, on its first request: `data[0].id` must equal the
// configured model, or when none was given, the model of the first endpoint checked; a difference
// is fatal (a wrong server would silently feed another model's hidden states).
//
// Concurrency: at most `fetch_threads` requests are on the wire at once, over all callers; callers
// beyond that wait for a slot. Backoff sleeps do not hold a slot. `cancel()` ends transfers and
// sleeps at once (for shutdown); a CancelScope's flag ends the calling thread's request alone (a
// hedged fetch that lost), within ~20 ms when it waits and ~0.15 s in a transfer (libcurl's
// progress callback).
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/stats_tree.h"
#include "draftfeed/online/endpoints.h"
#include "draftfeed/online/vllm_protocol.h"

namespace draftfeed {

// The environment variable a key for servers started with --api-key is taken from when the options
// give none: the one the reference's OpenAI client reads.
inline constexpr const char* kApiKeyVariable = "OPENAI_API_KEY";

struct VllmClientOptions {
  std::vector<std::string> endpoints{"http://localhost:8000/v1"};
  std::string model;  // expected data[0].id; empty: accept what the first endpoint serves
  std::chrono::duration<double> request_timeout{120.0};  // per attempt; 0 = no limit
  int max_retries = 3;
  std::chrono::duration<double> retry_backoff{2.0};  // before the first retry; doubles after
  // Requests in flight at most, over all callers. The reference's name: each of its workers
  // fetched with a pool of `fetch_threads` threads, one request each; here a request holds one
  // of the engine's fetches (SampleSource::blocking_fetches), so the engine sizes its threads
  // from it.
  int fetch_threads = 8;
  EndpointOptions endpoint;  // resting a failing server; keep-alive, the response size bound

  // The only check of these fields (Error kInvalidArgument naming the field): fetch_threads in
  // [1, 4096], retries and times >= 0, and `endpoint`'s. The endpoints themselves are checked
  // where the client connects to them (EndpointSet: at least one, each an http(s) URL).
  void validate() const;
};

struct GenerationResult {
  enum class Failure : std::uint8_t {
    kNone,
    kExhausted,        // transport errors / timeouts / 5xx on every attempt
    kHttpStatus,       // a status that is not retried (4xx)
    kInvalidResponse,  // see `problem`
    kWrongModel,       // fatal: the server serves another model
    kCancelled,
  };
  Failure failure = Failure::kNone;
  ResponseProblem problem = ResponseProblem::kNone;  // for kInvalidResponse (kNone: too large)
  std::string message;          // names the endpoint, the attempts and the last error
  std::string handle;           // on success
  std::string transfer_params;  // on success: kv_transfer_params as JSON text
  std::string endpoint;         // the endpoint of the last attempt
  int attempts = 0;
  bool ok() const { return failure == Failure::kNone; }
  bool fatal() const { return failure == Failure::kWrongModel; }
};

const char* generation_failure_name(GenerationResult::Failure failure);

struct VllmClientStats {
  std::int64_t requests = 0;      // generation requests sent (attempts)
  std::int64_t model_checks = 0;  // GET /models sent
  std::int64_t succeeded = 0;     // requests answered with a valid response
  std::int64_t retries = 0;       // attempts after a retryable failure
  std::int64_t transport_errors = 0;
  std::int64_t timeouts = 0;
  std::int64_t http_retryable = 0;  // 5xx, 408, 429
  std::int64_t http_other = 0;      // other non-2xx statuses
  std::int64_t too_large = 0;
  std::int64_t invalid_responses = 0;  // all problems together (too large excluded)
  std::array<std::int64_t, static_cast<std::size_t>(ResponseProblem::kCount)> problems{};
  std::int64_t exhausted = 0;  // generate() calls that ran out of attempts
  std::int64_t in_flight = 0;
  std::int64_t max_in_flight = 0;
  std::int64_t connections_opened = 0;
  std::string model;
  std::vector<EndpointStats> endpoints;
};

// Each statistic under its reported name (common/stats_tree.h).
template <typename Visit>
void for_each_stat(const VllmClientStats& c, Visit&& visit) {
  visit("model", c.model);
  visit("requests", c.requests);
  visit("model_checks", c.model_checks);
  visit("succeeded", c.succeeded);
  visit("retries", c.retries);
  visit("transport_errors", c.transport_errors);
  visit("timeouts", c.timeouts);
  visit("http_retryable", c.http_retryable);
  visit("http_other", c.http_other);
  visit("too_large", c.too_large);
  visit("invalid_responses", c.invalid_responses);
  visit("problems", named_counts(c.problems, response_problem_name, 1));
  visit("exhausted", c.exhausted);
  visit("in_flight", c.in_flight);
  visit("max_in_flight", c.max_in_flight);
  visit("connections_opened", c.connections_opened);
  visit("endpoints", c.endpoints);
}

class VllmClient {
 public:
  // Throws kInvalidArgument for bad options (VllmClientOptions::validate).
  explicit VllmClient(const VllmClientOptions& options);

  // One generation request for `ids`: completions with the ids as the prompt.
  GenerationResult generate(std::span<const std::int64_t> ids);
  // The chat request for a multimodal row (`messages_json`: the row's turns); the response's
  // prompt ids must equal `ids`.
  GenerationResult generate_chat(std::string_view messages_json, std::span<const std::int64_t> ids);

  void cancel();
  // Undoes cancel(): later calls run normally (calls under way when cancel() came still end).
  void resume();
  bool cancelled() const { return cancelled_.load(); }
  VllmClientStats stats() const;
  const VllmClientOptions& options() const { return options_; }

 private:
  GenerationResult run(RequestKind kind, std::string_view payload,
                       std::span<const std::int64_t> ids);
  // One attempt on one endpoint; fills `result` and returns whether a retry may help.
  bool attempt_once(EndpointSet::Lease& lease, RequestKind kind, std::string_view payload,
                    std::span<const std::int64_t> ids, GenerationResult& result);
  // The endpoint's model, checking it first if needed; false with `result` filled on failure.
  bool ensure_model(EndpointSet::Lease& lease, GenerationResult& result, bool& retryable);
  // false: the calling task was cancelled alone (cancel_scope.h) while it waited.
  bool take_slot();
  void give_slot();
  bool sleep_unless_cancelled(std::chrono::duration<double> time);

  const VllmClientOptions options_;
  EndpointSet endpoints_;
  std::atomic<bool> cancelled_{false};

  mutable std::mutex mutex_;  // guards the slots, the model and the counters below
  std::condition_variable slot_freed_;
  std::condition_variable cancel_signal_;
  int slots_used_ = 0;
  std::string model_;  // the agreed model once known
  VllmClientStats counts_;
};

}  // namespace draftfeed
