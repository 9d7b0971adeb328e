// The part of a vLLM server with a hidden-states connector that draftfeed's client talks to, as a
// handler for LocalHttpServer: `GET /v1/models` names `model`; `POST /v1/completions` echoes the
// prompt ids and names the file `write` made for them (docs/protocol.md). Counters and hooks let a
// test fail attempts, hold requests or corrupt answers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "local_http_server.h"

namespace draftfeed {

struct FakeVllm {
  std::string model = "verifier";
  // Makes the hidden-state file for the prompt and returns its path (the handle).
  std::function<std::string(const std::vector<std::int64_t>& ids)> write = [](const auto&) {
    return std::string("/nonexistent/hs.safetensors");
  };
  std::function<void()> hold;          // runs inside every completion (a test may block there)
  std::atomic<int> fail_first{0};      // answer this many completions with HTTP 503 first
  std::atomic<bool> wrong_ids{false};  // echo other prompt ids (an invalid response)

  std::atomic<int> models{0};
  std::atomic<int> completions{0};
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};

  LocalHttpServer::Handler handler() {
    return [this](const HttpRequestSeen& request) { return answer(request); };
  }

  HttpReply answer(const HttpRequestSeen& request) {
    if (request.method == "GET" && request.path == "/v1/models") {
      ++models;
      return HttpReply{200, nlohmann::json{{"data", {{{"id", model}}}}}.dump()};
    }
    if (request.method != "POST" || request.path != "/v1/completions") return HttpReply{404, "{}"};
    ++completions;
    const int now = ++in_flight;
    int seen = max_in_flight.load();
    while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
    }
    if (hold) hold();
    HttpReply reply;
    if (fail_first.fetch_sub(1) > 0) {
      reply = HttpReply{503, "{\"error\":\"busy\"}"};
    } else {
      const auto body = nlohmann::json::parse(request.body);
      std::vector<std::int64_t> ids = body.at("prompt").get<std::vector<std::int64_t>>();
      const std::string handle = write(ids);
      if (wrong_ids) ids.push_back(7);
      reply.body = nlohmann::json{{"choices", {{{"prompt_token_ids", ids}}}},
                                  {"kv_transfer_params", {{"hidden_states_path", handle}}}}
                       .dump();
    }
    --in_flight;
    return reply;
  }
};

}  // namespace draftfeed
