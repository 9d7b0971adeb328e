#include "draftfeed/online/vllm_client.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

#include "draftfeed/common/cancel_scope.h"
#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

constexpr std::array<EnumName<GenerationResult::Failure>, 6> kGenerationFailureNames = {{
    {GenerationResult::Failure::kNone, "ok"},
    {GenerationResult::Failure::kExhausted, "retries exhausted"},
    {GenerationResult::Failure::kHttpStatus, "http status"},
    {GenerationResult::Failure::kInvalidResponse, "invalid response"},
    {GenerationResult::Failure::kWrongModel, "wrong model"},
    {GenerationResult::Failure::kCancelled, "cancelled"},
}};

}  // namespace

namespace {

std::string clipped(const std::string& text, std::size_t limit = 200) {
  if (text.size() <= limit) return text;
  return text.substr(0, limit) + "...";
}

bool retryable_status(long status) { return status >= 500 || status == 408 || status == 429; }

const char* path_of(RequestKind kind) {
  return kind == RequestKind::kCompletions ? "/completions" : "/chat/completions";
}

}  // namespace

const char* generation_failure_name(GenerationResult::Failure failure) {
  return enum_name(failure, kGenerationFailureNames);
}

void VllmClientOptions::validate() const {
  require(fetch_threads >= 1 && fetch_threads <= 4096, ErrorKind::kInvalidArgument,
          "fetch_threads must be between 1 and 4096, got " + std::to_string(fetch_threads));
  require(max_retries >= 0, ErrorKind::kInvalidArgument,
          "max_retries must be >= 0, got " + std::to_string(max_retries));
  require(request_timeout.count() >= 0 && retry_backoff.count() >= 0, ErrorKind::kInvalidArgument,
          "request_timeout and retry_backoff must be >= 0 (got " +
              std::to_string(request_timeout.count()) + " and " +
              std::to_string(retry_backoff.count()) + ")");
  endpoint.validate();
}

namespace {

// The options as used: checked, and the API key taken from the environment variable the OpenAI
// client reads (OPENAI_API_KEY) when none was given.
VllmClientOptions checked(const VllmClientOptions& options) {
  options.validate();
  VllmClientOptions out = options;
  if (out.endpoint.http.api_key.empty()) {
    if (const char* key = std::getenv(kApiKeyVariable)) out.endpoint.http.api_key = key;
  }
  return out;
}

}  // namespace

VllmClient::VllmClient(const VllmClientOptions& options)
    : options_(checked(options)), endpoints_(options_.endpoints, options_.endpoint) {
  model_ = options_.model;
}

GenerationResult VllmClient::generate(std::span<const std::int64_t> ids) {
  return run(RequestKind::kCompletions, {}, ids);
}

GenerationResult VllmClient::generate_chat(std::string_view messages_json,
                                           std::span<const std::int64_t> ids) {
  return run(RequestKind::kChat, messages_json, ids);
}

void VllmClient::cancel() {
  cancelled_.store(true);
  endpoints_.cancel();
  std::lock_guard lock(mutex_);
  slot_freed_.notify_all();
  cancel_signal_.notify_all();
}

void VllmClient::resume() {
  endpoints_.resume();
  cancelled_.store(false);
}

// A task cancelled alone (cancel_scope.h) signals no condition variable: waits look at its flag
// this often.
constexpr std::chrono::milliseconds kScopePoll{20};

bool VllmClient::take_slot() {
  std::unique_lock lock(mutex_);
  while (!slot_freed_.wait_for(lock, kScopePoll, [this] {
    return slots_used_ < options_.fetch_threads || cancelled_.load();
  })) {
    if (CancelScope::cancelled()) return false;
  }
  if (CancelScope::cancelled()) return false;
  ++slots_used_;
  counts_.in_flight = slots_used_;
  counts_.max_in_flight = std::max<std::int64_t>(counts_.max_in_flight, slots_used_);
  return true;
}

void VllmClient::give_slot() {
  {
    std::lock_guard lock(mutex_);
    --slots_used_;
    counts_.in_flight = slots_used_;
  }
  slot_freed_.notify_one();
}

bool VllmClient::sleep_unless_cancelled(std::chrono::duration<double> time) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(time);
  std::unique_lock lock(mutex_);
  while (!cancelled_.load() && !CancelScope::cancelled()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) break;
    cancel_signal_.wait_until(lock, std::min(until, now + kScopePoll),
                              [this] { return cancelled_.load(); });
  }
  return !cancelled_.load() && !CancelScope::cancelled();
}

GenerationResult VllmClient::run(RequestKind kind, std::string_view payload,
                                 std::span<const std::int64_t> ids) {
  GenerationResult result;
  const int total = options_.max_retries + 1;
  for (int attempt = 1; attempt <= total; ++attempt) {
    if (cancelled_.load() || CancelScope::cancelled()) {
      result.failure = GenerationResult::Failure::kCancelled;
      result.message = cancelled_.load() ? "the client was cancelled" : "the request was cancelled";
      return result;
    }
    bool retryable = false;
    // First: the endpoint is chosen when the request can go, by the load then.
    if (!take_slot()) {
      result.failure = GenerationResult::Failure::kCancelled;
      result.message = "the request was cancelled while it waited for a slot";
      return result;
    }
    {
      EndpointSet::Lease lease = endpoints_.acquire();
      result.endpoint = lease.endpoint().pool.base_url();
      result.attempts = attempt;
      if (ensure_model(lease, result, retryable)) {
        retryable = attempt_once(lease, kind, payload, ids, result);
      }
    }
    give_slot();
    if (result.ok() || !retryable) return result;
    if (attempt < total) {
      {
        std::lock_guard lock(mutex_);
        ++counts_.retries;
      }
      const auto backoff = options_.retry_backoff * std::pow(2.0, attempt - 1);
      if (!sleep_unless_cancelled(backoff)) {
        result.failure = GenerationResult::Failure::kCancelled;
        result.message =
            cancelled_.load() ? "the client was cancelled" : "the request was cancelled";
        return result;
      }
    }
  }
  result.failure = GenerationResult::Failure::kExhausted;
  result.message = "gave up after " + std::to_string(total) + " attempts: " + result.message;
  std::lock_guard lock(mutex_);
  ++counts_.exhausted;
  return result;
}

bool VllmClient::ensure_model(EndpointSet::Lease& lease, GenerationResult& result,
                              bool& retryable) {
  Endpoint& endpoint = lease.endpoint();
  if (endpoints_.model_of(endpoint)) return true;
  std::lock_guard check_lock(endpoint.model_check);
  if (endpoints_.model_of(endpoint)) return true;  // another request checked it meanwhile
  const std::string url = endpoint.pool.base_url() + "/models";
  {
    std::lock_guard lock(mutex_);
    ++counts_.model_checks;
  }
  HttpResult http = endpoint.pool.get("/models", options_.request_timeout);
  retryable = false;
  if (http.outcome != HttpResult::Outcome::kResponse || http.status < 200 || http.status >= 300) {
    const bool server_failure =
        http.outcome == HttpResult::Outcome::kTimeout ||
        http.outcome == HttpResult::Outcome::kTransport ||
        (http.outcome == HttpResult::Outcome::kResponse && retryable_status(http.status));
    std::lock_guard lock(mutex_);
    if (http.outcome == HttpResult::Outcome::kCancelled) {
      result.failure = GenerationResult::Failure::kCancelled;
      result.message = "GET " + url + ": cancelled";
      return false;
    }
    if (http.outcome == HttpResult::Outcome::kTimeout) ++counts_.timeouts;
    if (http.outcome == HttpResult::Outcome::kTransport) ++counts_.transport_errors;
    if (http.outcome == HttpResult::Outcome::kTooLarge) ++counts_.too_large;
    if (http.outcome == HttpResult::Outcome::kResponse) {
      ++(retryable_status(http.status) ? counts_.http_retryable : counts_.http_other);
    }
    result.failure = server_failure ? GenerationResult::Failure::kExhausted
                     : http.outcome == HttpResult::Outcome::kTooLarge
                         ? GenerationResult::Failure::kInvalidResponse
                         : GenerationResult::Failure::kHttpStatus;
    result.message = "GET " + url + ": " +
                     (http.outcome == HttpResult::Outcome::kResponse
                          ? "HTTP " + std::to_string(http.status) + ": " + clipped(http.body)
                          : std::string(http_outcome_name(http.outcome)) + ": " + http.error);
    retryable = server_failure;
    lease.report(!server_failure);
    return false;
  }
  const ModelsResponse models = parse_models_response(http.body);
  lease.report(true);
  if (!models.ok()) {
    std::lock_guard lock(mutex_);
    ++counts_.invalid_responses;
    ++counts_.problems[static_cast<std::size_t>(models.problem)];
    result.failure = GenerationResult::Failure::kInvalidResponse;
    result.problem = models.problem;
    result.message = "GET " + url + ": " + models.message;
    return false;
  }
  std::lock_guard lock(mutex_);
  if (model_.empty()) model_ = models.model;
  if (models.model != model_) {
    result.failure = GenerationResult::Failure::kWrongModel;
    result.message =
        "GET " + url + ": the server serves model '" + models.model + "' but " +
        (options_.model.empty() ? "another endpoint serves '" : "the model asked for is '") +
        model_ + "': check --endpoint / vllm_endpoint";
    return false;
  }
  counts_.model = model_;
  endpoints_.record_model(endpoint, models.model);
  return true;
}

bool VllmClient::attempt_once(EndpointSet::Lease& lease, RequestKind kind, std::string_view payload,
                              std::span<const std::int64_t> ids, GenerationResult& result) {
  Endpoint& endpoint = lease.endpoint();
  std::string model;
  {
    std::lock_guard lock(mutex_);
    model = model_;
    ++counts_.requests;
  }
  std::string body;
  if (kind == RequestKind::kCompletions) {
    body = completions_request_body(model, ids);
  } else {
    auto chat = chat_request_body(model, payload);
    if (!chat.ok()) {
      result.failure = GenerationResult::Failure::kInvalidResponse;
      result.message = chat.error().what();
      return false;
    }
    body = std::move(chat).value();
  }
  const std::string where = "POST " + endpoint.pool.base_url() + path_of(kind);
  HttpResult http = endpoint.pool.post_json(path_of(kind), body, options_.request_timeout);

  std::lock_guard lock(mutex_);
  switch (http.outcome) {
    case HttpResult::Outcome::kCancelled:
      result.failure = GenerationResult::Failure::kCancelled;
      result.message = where + ": cancelled";
      return false;
    case HttpResult::Outcome::kTimeout:
    case HttpResult::Outcome::kTransport:
      ++(http.outcome == HttpResult::Outcome::kTimeout ? counts_.timeouts
                                                       : counts_.transport_errors);
      result.failure = GenerationResult::Failure::kExhausted;
      result.message = where + ": " + http_outcome_name(http.outcome) + ": " + http.error;
      lease.report(false);
      return true;
    case HttpResult::Outcome::kTooLarge:
      ++counts_.too_large;
      result.failure = GenerationResult::Failure::kInvalidResponse;
      result.message = where + ": " + http.error;
      lease.report(true);
      return false;
    case HttpResult::Outcome::kResponse:
      break;
  }
  if (http.status < 200 || http.status >= 300) {
    const bool retry = retryable_status(http.status);
    ++(retry ? counts_.http_retryable : counts_.http_other);
    result.failure =
        retry ? GenerationResult::Failure::kExhausted : GenerationResult::Failure::kHttpStatus;
    result.message = where + ": HTTP " + std::to_string(http.status) + ": " + clipped(http.body);
    lease.report(!retry);
    return retry;
  }
  lease.report(true);
  GenerationResponse response = parse_generation_response(http.body, kind, ids);
  if (!response.ok()) {
    ++counts_.invalid_responses;
    ++counts_.problems[static_cast<std::size_t>(response.problem)];
    result.failure = GenerationResult::Failure::kInvalidResponse;
    result.problem = response.problem;
    result.message = where + ": invalid response: " + response.message;
    return false;
  }
  ++counts_.succeeded;
  result.failure = GenerationResult::Failure::kNone;
  result.problem = ResponseProblem::kNone;
  result.message.clear();
  result.handle = std::move(response.handle);
  result.transfer_params = std::move(response.transfer_params);
  return false;
}

VllmClientStats VllmClient::stats() const {
  VllmClientStats out;
  {
    std::lock_guard lock(mutex_);
    out = counts_;
    out.model = model_;
  }
  out.endpoints = endpoints_.stats();
  out.connections_opened = 0;
  for (const auto& e : out.endpoints) out.connections_opened += e.connections_opened;
  return out;
}

}  // namespace draftfeed
