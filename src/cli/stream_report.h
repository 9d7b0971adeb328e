// Streaming an epoch through the pipeline with a progress bar and a throughput summary; shared by
// `draftfeed demo` and `draftfeed bench`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "draftfeed/common/stats_tree.h"
#include "draftfeed/loader/loader.h"

namespace draftfeed::cli {

struct StreamSummary {
  std::string label;
  std::int64_t batches = 0;
  std::int64_t tokens = 0;
  std::int64_t hidden_bytes = 0;
  double seconds = 0;
  double first_batch_seconds = 0;
  double consumer_wait_seconds = 0;
  std::size_t pool_bytes = 0;
  int extra_buffers = 0;
  bool pinned = false;
  DropCounts dropped{};

  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
  double gb_per_s() const {
    return seconds > 0 ? static_cast<double>(hidden_bytes) / seconds / 1e9 : 0;
  }
};

// Each figure under its reported name (common/stats_tree.h): the pass's JSON (extra_buffers is the
// text report's).
template <typename Visit>
void for_each_stat(const StreamSummary& s, Visit&& visit) {
  visit("label", s.label);
  visit("batches", s.batches);
  visit("tokens", s.tokens);
  visit("hidden_bytes", s.hidden_bytes);
  visit("seconds", s.seconds);
  visit("tokens_per_s", s.tokens_per_s());
  visit("gb_per_s", s.gb_per_s());
  visit("first_batch_seconds", s.first_batch_seconds);
  visit("consumer_wait_seconds", s.consumer_wait_seconds);
  visit("pool_bytes", s.pool_bytes);
  visit("pinned", s.pinned);
  visit("dropped", named_counts(s.dropped, drop_reason_name));
}

// Runs one pass over the loader's plan of `epoch` and returns what happened. `progress` draws a
// bar on stderr.
StreamSummary stream_pass(Loader& loader, const std::string& label, std::int64_t epoch,
                          bool progress);

// Prints a summary block (and returns it as JSON text when `json`).
void print_summary(const StreamSummary& summary);
std::string summary_json(const StreamSummary& summary);

// Peak resident memory of this process (getrusage), bytes.
std::int64_t peak_rss_bytes();

std::string human_bytes(double bytes);

}  // namespace draftfeed::cli
