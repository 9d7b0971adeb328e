#include "online_flags.h"

#include "draftfeed/pack/pack_appender.h"

namespace draftfeed::cli {

namespace {

using seconds = std::chrono::duration<double>;

}  // namespace

const FlagTable& online_flags() {
  static const FlagTable flags = [] {
    const OnlineSourceOptions d;
    return FlagTable{
        {"endpoint", "URL",
         "a server's OpenAI API base, e.g. http://host:8000/v1 (repeat for several)"},
        {"server-dir", "DIR", "folder the servers write into: handles elsewhere are refused"},
        {"fetch-threads", "N",
         "requests in flight (default " + std::to_string(d.client.fetch_threads) +
             "; the engine gets N more threads)"},
        {"model", "NAME", "the model the servers must serve"},
        {"request-timeout", "S",
         "seconds per attempt (default " + default_text(d.client.request_timeout.count()) +
             "; 0: no limit)"},
        {"max-retries", "N",
         "extra attempts after transport errors/timeouts/5xx (default " +
             std::to_string(d.client.max_retries) + ")"},
        {"retry-backoff", "S",
         "sleep before the first retry, doubling (default " +
             default_text(d.client.retry_backoff.count()) + ")"},
        {"generation-validation-retries", "N",
         "extra round trips after a bad file (default " +
             std::to_string(d.generation_validation_retries) + ")"},
        {"max-consecutive-failures", "N",
         "stop after N rows failing in a row (default " +
             std::to_string(d.max_consecutive_generation_failures) + ")"},
        {"fail-on-error", "", "stop at the first row that fails"},
        {"lock-timeout", "S",
         "wait for a writer's lock at most S seconds (default " +
             default_text(d.cache.lock_timeout.count()) + ")"},
        {"no-keepalive", "", "open a new connection per request"},
        {"cache-budget", "SIZE",
         "with --on-generate pack: the pack's bytes on disk at most, e.g. 500GB, 1.5TiB "
         "(default: no bound)"},
    };
  }();
  return flags;
}

OnlineSourceOptions online_options_from(const Args& args) {
  OnlineSourceOptions options;
  VllmClientOptions& client = options.client;
  client.endpoints = args.all("endpoint");
  for (const std::string& url : client.endpoints) {
    require(url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0,
            ErrorKind::kInvalidArgument,
            "--endpoint must start with http:// or https:// (e.g. http://host:8000/v1), got '" +
                url + "'");
  }
  options.server_dir = args.str("server-dir", options.server_dir);
  client.fetch_threads = static_cast<int>(args.integer("fetch-threads", client.fetch_threads, 1));
  client.model = args.str("model", client.model);
  client.request_timeout =
      seconds(args.real("request-timeout", client.request_timeout.count(), 0.0));
  client.max_retries = static_cast<int>(args.integer("max-retries", client.max_retries, 0));
  client.retry_backoff = seconds(args.real("retry-backoff", client.retry_backoff.count(), 0.0));
  client.endpoint.http.keep_alive = !args.has("no-keepalive");
  options.generation_validation_retries = static_cast<int>(
      args.integer("generation-validation-retries", options.generation_validation_retries, 0));
  options.max_consecutive_generation_failures = static_cast<int>(
      args.integer("max-consecutive-failures", options.max_consecutive_generation_failures, 1));
  options.fail_on_hidden_state_error = args.has("fail-on-error");
  options.cache.lock_timeout =
      seconds(args.real("lock-timeout", options.cache.lock_timeout.count(), 0.0));
  if (const auto budget = args.opt_str("cache-budget")) {
    options.cache_budget_bytes = parse_byte_size(*budget, "--cache-budget");
  }
  return options;
}

const FlagTable& lookahead_flags() {
  static const FlagTable flags = [] {
    const LookaheadOptions d;
    return FlagTable{
        {"lookahead", "ROWS",
         "rows fetched ahead of the batch buffers at most (default " +
             std::to_string(LookaheadOptions::kRowsPerFetch) +
             " x --fetch-threads; 0: off), their bytes within --read-ahead-bytes"},
        {"lookahead-next-epoch", "",
         "fetch the next epoch's first rows while this epoch's last requests run"},
        {"hedge-factor", "X",
         "ask again for a row whose request ran X times its predicted time (default " +
             default_text(d.hedge.factor) + "; 0: never)"},
        {"hedge-min-seconds", "S",
         "and at least S seconds (default " + default_text(d.hedge.min_wait.count()) + ")"},
    };
  }();
  return flags;
}

LookaheadOptions lookahead_options_from(const Args& args) {
  LookaheadOptions options;
  if (const auto window = args.opt_integer("lookahead", 0)) {
    options.window = static_cast<int>(*window);
  }
  options.next_epoch = args.has("lookahead-next-epoch");
  options.hedge.factor = args.real("hedge-factor", options.hedge.factor, 0.0);
  options.hedge.min_wait = std::chrono::duration<double>(
      args.real("hedge-min-seconds", options.hedge.min_wait.count(), 0.0));
  return options;
}

}  // namespace draftfeed::cli
