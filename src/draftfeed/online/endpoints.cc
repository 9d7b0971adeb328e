#include "draftfeed/online/endpoints.h"

#include <limits>

#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

std::string normalised_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  require(url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0,
          ErrorKind::kInvalidArgument,
          "endpoint '" + url + "' must start with http:// or https:// (e.g. http://host:8000/v1)");
  return url;
}

}  // namespace

void EndpointOptions::validate() const {
  require(rest_after_failures >= 1 && rest_time.count() >= 0, ErrorKind::kInvalidArgument,
          "rest_after_failures must be >= 1 and rest_time >= 0 (got " +
              std::to_string(rest_after_failures) + " and " + std::to_string(rest_time.count()) +
              ")");
  http.validate();
}

EndpointSet::EndpointSet(const std::vector<std::string>& urls, EndpointOptions options)
    : options_(std::move(options)) {
  require(!urls.empty(), ErrorKind::kInvalidArgument, "at least one vLLM endpoint is needed");
  options_.validate();
  for (const auto& url : urls) {
    endpoints_.push_back(std::make_unique<Endpoint>(normalised_url(url), options_.http));
  }
}

EndpointSet::Lease::~Lease() {
  if (set_ == nullptr) return;
  std::lock_guard lock(set_->mutex_);
  --endpoint_->in_flight;
}

void EndpointSet::Lease::report(bool success) {
  std::lock_guard lock(set_->mutex_);
  Endpoint& e = *endpoint_;
  if (success) {
    e.consecutive_failures = 0;
    return;
  }
  ++e.failures;
  if (++e.consecutive_failures >= set_->options_.rest_after_failures) {
    e.consecutive_failures = 0;
    e.rested_until =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(set_->options_.rest_time);
    ++e.rests;
  }
}

EndpointSet::Lease EndpointSet::acquire() {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const std::size_t n = endpoints_.size();
  Endpoint* best = nullptr;
  Endpoint* soonest = nullptr;  // fallback when all rest
  for (std::size_t k = 0; k < n; ++k) {
    Endpoint* e = endpoints_[(next_tie_ + k) % n].get();
    if (e->rested_until > now) {
      if (soonest == nullptr || e->rested_until < soonest->rested_until) soonest = e;
      continue;
    }
    if (best == nullptr || e->in_flight < best->in_flight) best = e;
  }
  if (best == nullptr) best = soonest;
  next_tie_ = (next_tie_ + 1) % n;
  ++best->in_flight;
  ++best->requests;
  return Lease(this, best);
}

std::optional<std::string> EndpointSet::model_of(const Endpoint& endpoint) const {
  std::lock_guard lock(mutex_);
  return endpoint.model;
}

void EndpointSet::record_model(Endpoint& endpoint, const std::string& model) {
  std::lock_guard lock(mutex_);
  endpoint.model = model;
}

void EndpointSet::cancel() {
  for (auto& e : endpoints_) e->pool.cancel();
}

void EndpointSet::resume() {
  for (auto& e : endpoints_) e->pool.resume();
}

std::vector<EndpointStats> EndpointSet::stats() const {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  std::vector<EndpointStats> out;
  for (const auto& e : endpoints_) {
    EndpointStats s;
    s.url = e->pool.base_url();
    s.requests = e->requests;
    s.failures = e->failures;
    s.rests = e->rests;
    s.connections_opened = e->pool.connections_opened();
    s.in_flight = e->in_flight;
    s.resting = e->rested_until > now;
    s.model = e->model.value_or("");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace draftfeed
