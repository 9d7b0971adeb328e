// Several vLLM servers behind one client: each request goes to the endpoint with the fewest
// requests in flight; an endpoint that fails `rest_after_failures` times in a row (transport
// errors, timeouts, HTTP 5xx) is rested, i.e. skipped for `rest_time`, then tried again. When every
// endpoint is resting the one whose rest ends first is used anyway, so the run goes on while any
// server works and comes back when one does.
//
// Thread safety: every method may be called from any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "draftfeed/online/http_pool.h"

namespace draftfeed {

struct EndpointOptions {
  int rest_after_failures = 3;
  std::chrono::duration<double> rest_time{30.0};
  HttpPoolOptions http;  // each endpoint's connections

  // The only check of these fields (and http's): Error kInvalidArgument naming the field.
  void validate() const;
};

struct EndpointStats {
  std::string url;
  std::int64_t requests = 0;  // attempts sent here (models checks included)
  std::int64_t failures = 0;  // attempts that failed here (transport, timeout, 5xx)
  std::int64_t rests = 0;     // times it was rested
  std::int64_t connections_opened = 0;
  int in_flight = 0;
  bool resting = false;
  std::string model;  // data[0].id once checked
};

template <typename Visit>
void for_each_stat(const EndpointStats& e, Visit&& visit) {
  visit("url", e.url);
  visit("requests", e.requests);
  visit("failures", e.failures);
  visit("rests", e.rests);
  visit("connections_opened", e.connections_opened);
  visit("in_flight", e.in_flight);
  visit("resting", e.resting);
  visit("model", e.model);
}

class Endpoint {
 public:
  Endpoint(std::string url, const HttpPoolOptions& http) : pool(std::move(url), http) {}
  HttpPool pool;
  // Held while the endpoint's /models check runs, so concurrent first requests check it once.
  std::mutex model_check;

 private:
  friend class EndpointSet;
  int in_flight = 0;
  int consecutive_failures = 0;
  std::chrono::steady_clock::time_point rested_until{};
  std::int64_t requests = 0;
  std::int64_t failures = 0;
  std::int64_t rests = 0;
  std::optional<std::string> model;  // set by the first successful /models check
};

class EndpointSet {
 public:
  // `urls` non-empty; trailing slashes are dropped. Throws kInvalidArgument naming a bad URL.
  EndpointSet(const std::vector<std::string>& urls, EndpointOptions options);

  // An endpoint chosen for one attempt; counts as in flight until it is destroyed.
  class Lease {
   public:
    Lease(EndpointSet* set, Endpoint* endpoint) : set_(set), endpoint_(endpoint) {}
    Lease(Lease&& other) noexcept : set_(other.set_), endpoint_(other.endpoint_) {
      other.set_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    Endpoint& endpoint() const { return *endpoint_; }
    // Records the attempt's outcome: a failure counts toward resting, a success resets it.
    void report(bool success);

   private:
    EndpointSet* set_;
    Endpoint* endpoint_;
  };

  Lease acquire();

  // The model the endpoint serves, once known; `record_model` stores it.
  std::optional<std::string> model_of(const Endpoint& endpoint) const;
  void record_model(Endpoint& endpoint, const std::string& model);

  void cancel();
  void resume();
  std::size_t size() const { return endpoints_.size(); }
  std::vector<EndpointStats> stats() const;

 private:
  const EndpointOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  mutable std::mutex mutex_;  // guards every Endpoint's counters
  std::size_t next_tie_ = 0;  // rotates among equally loaded endpoints
};

}  // namespace draftfeed
