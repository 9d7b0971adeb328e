#include "draftfeed/online/http_pool.h"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>

#include "draftfeed/common/cancel_scope.h"
#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

// curl_global_init is not thread-safe: run it once, before the first handle.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
    require(code == CURLE_OK, ErrorKind::kRuntime,
            std::string("curl_global_init failed: ") + curl_easy_strerror(code));
  });
}

struct Transfer {
  std::string* body;
  std::size_t max_bytes;
  bool too_large = false;
  const std::atomic<bool>* cancelled;
};

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const std::size_t bytes = size * count;  // libcurl guarantees size == 1
  if (transfer->body->size() + bytes > transfer->max_bytes) {
    transfer->too_large = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  transfer->body->append(data, bytes);
  return bytes;
}

// Also ends a transfer whose task was cancelled alone (cancel_scope.h: runs on the caller's
// thread, as curl_easy_perform does).
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const bool cancelled =
      static_cast<Transfer*>(user)->cancelled->load() || CancelScope::cancelled();
  return cancelled ? 1 : 0;  // non-zero aborts
}

}  // namespace

constexpr std::array<EnumName<HttpResult::Outcome>, 5> kHttpOutcomeNames = {{
    {HttpResult::Outcome::kResponse, "response"},
    {HttpResult::Outcome::kTimeout, "timeout"},
    {HttpResult::Outcome::kTransport, "transport error"},
    {HttpResult::Outcome::kTooLarge, "response too large"},
    {HttpResult::Outcome::kCancelled, "cancelled"},
}};

const char* http_outcome_name(HttpResult::Outcome outcome) {
  return enum_name(outcome, kHttpOutcomeNames);
}

void HttpPoolOptions::validate() const {
  require(max_body_bytes > 0, ErrorKind::kInvalidArgument, "max_response_bytes must be positive");
}

HttpPool::HttpPool(std::string base_url, HttpPoolOptions options)
    : base_url_(std::move(base_url)), options_(std::move(options)) {
  options_.validate();
  init_curl_once();
}

HttpPool::~HttpPool() {
  for (void* handle : idle_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* HttpPool::take_handle() {
  {
    std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      void* handle = idle_.back();
      idle_.pop_back();
      return handle;
    }
  }
  CURL* handle = curl_easy_init();
  require(handle != nullptr, ErrorKind::kRuntime, "curl_easy_init failed");
  return handle;
}

void HttpPool::give_back(void* handle) {
  std::lock_guard lock(mutex_);
  idle_.push_back(handle);
}

HttpResult HttpPool::get(const std::string& path, std::chrono::duration<double> timeout) {
  return perform(path, nullptr, timeout);
}

HttpResult HttpPool::post_json(const std::string& path, const std::string& body,
                               std::chrono::duration<double> timeout) {
  return perform(path, &body, timeout);
}

HttpResult HttpPool::perform(const std::string& path, const std::string* post_body,
                             std::chrono::duration<double> timeout) {
  HttpResult result;
  if (cancelled_.load() || CancelScope::cancelled()) {
    result.outcome = HttpResult::Outcome::kCancelled;
    result.error = "cancelled before the request";
    return result;
  }
  CURL* curl = static_cast<CURL*>(take_handle());
  curl_easy_reset(curl);  // keeps the connection cache, clears the previous request's options

  Transfer transfer{&result.body, options_.max_body_bytes, false, &cancelled_};
  char error_buffer[CURL_ERROR_SIZE] = {0};
  const std::string url = base_url_ + path;
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Accept: application/json");
  if (!options_.api_key.empty()) {
    // Sent as the OpenAI client sends it; never logged (libcurl's verbose output stays off).
    headers = curl_slist_append(headers, ("Authorization: Bearer " + options_.api_key).c_str());
  }
  // Timeouts across threads: no signals (libcurl would use SIGALRM for DNS otherwise).
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  if (!options_.keep_alive) curl_easy_setopt(curl, CURLOPT_FORBID_REUSE, 1L);
  if (timeout.count() > 0) {
    const long ms = static_cast<long>(std::max(1.0, std::ceil(timeout.count() * 1000.0)));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ms);
  }
  if (post_body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, post_body->data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(post_body->size()));
  } else {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  }

  const auto start = std::chrono::steady_clock::now();
  const CURLcode code = curl_easy_perform(curl);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long connects = 0;
  curl_easy_getinfo(curl, CURLINFO_NUM_CONNECTS, &connects);
  result.new_connections = connects;
  connections_opened_.fetch_add(connects);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  // The buffer is this frame's: the handle waits in the pool after it returns.
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  curl_slist_free_all(headers);

  if (code == CURLE_OK) {
    result.outcome = HttpResult::Outcome::kResponse;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result.status);
  } else {
    result.error = error_buffer[0] != 0 ? error_buffer : curl_easy_strerror(code);
    if (transfer.too_large) {
      result.outcome = HttpResult::Outcome::kTooLarge;
      result.error =
          "the response body passed " + std::to_string(options_.max_body_bytes) + " bytes";
    } else if (code == CURLE_ABORTED_BY_CALLBACK) {
      result.outcome = HttpResult::Outcome::kCancelled;
    } else if (code == CURLE_OPERATION_TIMEDOUT) {
      result.outcome = HttpResult::Outcome::kTimeout;
    } else {
      result.outcome = HttpResult::Outcome::kTransport;
    }
    result.body.clear();
  }
  give_back(curl);
  return result;
}

}  // namespace draftfeed
