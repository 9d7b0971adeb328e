// HTTP requests to one server over libcurl, with keep-alive connection reuse.
//
// The pool keeps idle easy handles; each holds its own open connection, so a request that takes a
// pooled handle reuses that connection (no new TCP handshake) and at most as many connections are
// open as requests ever ran at once. Transfers run in the calling thread (curl_easy_perform): the
// caller bounds concurrency (see VllmClient). Every transfer has a total timeout, a bounded body
// (a longer one is abandoned as kTooLarge) and can be cancelled from another thread.
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace draftfeed {

struct HttpResult {
  enum class Outcome : std::uint8_t {
    kResponse,   // the server answered (any status)
    kTimeout,    // the total timeout passed
    kTransport,  // no connection, connection dropped, empty reply...
    kTooLarge,   // the body passed the pool's bound (the transfer was abandoned)
    kCancelled,  // cancel() was called during the transfer
  };
  Outcome outcome = Outcome::kTransport;
  long status = 0;           // HTTP status when kResponse
  std::string body;          // when kResponse
  std::string error;         // libcurl's description otherwise
  double seconds = 0;        // wall time of the transfer
  long new_connections = 0;  // connections this transfer opened (0 when one was reused)
};

const char* http_outcome_name(HttpResult::Outcome outcome);

struct HttpPoolOptions {
  bool keep_alive = true;  // reuse connections; false opens a fresh one per request
  // Longer bodies are refused (a hidden-state response is a few hundred bytes plus the echoed
  // prompt ids: 1 MiB holds about 100k ids).
  std::size_t max_body_bytes = std::size_t{1} << 20;
  // Sent as `Authorization: Bearer <api_key>` when not empty: for servers started with --api-key.
  std::string api_key;

  // The only check of these fields (Error kInvalidArgument naming the field).
  void validate() const;
};

class HttpPool {
 public:
  // `base_url` without a trailing slash, e.g. "http://127.0.0.1:8000/v1".
  HttpPool(std::string base_url, HttpPoolOptions options);
  ~HttpPool();
  HttpPool(const HttpPool&) = delete;
  HttpPool& operator=(const HttpPool&) = delete;

  const std::string& base_url() const { return base_url_; }

  // GET / POST (JSON body) `base_url + path`, giving up after `timeout` (0: no limit).
  HttpResult get(const std::string& path, std::chrono::duration<double> timeout);
  HttpResult post_json(const std::string& path, const std::string& body,
                       std::chrono::duration<double> timeout);

  // Makes running and later transfers end at once with kCancelled.
  void cancel() { cancelled_.store(true); }
  // Undoes cancel() for later transfers (the pipeline resumes after a stop).
  void resume() { cancelled_.store(false); }
  bool cancelled() const { return cancelled_.load(); }

  // Connections opened so far (summed over transfers).
  std::int64_t connections_opened() const { return connections_opened_.load(); }

 private:
  HttpResult perform(const std::string& path, const std::string* post_body,
                     std::chrono::duration<double> timeout);
  void* take_handle();
  void give_back(void* handle);

  const std::string base_url_;
  const HttpPoolOptions options_;
  std::atomic<bool> cancelled_{false};
  std::atomic<std::int64_t> connections_opened_{0};
  std::mutex mutex_;
  std::vector<void*> idle_;  // CURL* handles with (possibly) open connections
};

}  // namespace draftfeed
