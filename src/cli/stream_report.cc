#include "stream_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "stats_json.h"
#include "timing.h"

namespace draftfeed::cli {

namespace {

void draw_bar(const std::string& label, std::int64_t done, std::int64_t total, double seconds,
              std::int64_t tokens, std::int64_t bytes) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const double rate = seconds > 0 ? 1.0 / seconds : 0;
  std::fprintf(stderr, "\r%-6s [%s] %lld/%lld batches  %8.0f tok/s  %7.2f GB/s  ", label.c_str(),
               bar.c_str(), static_cast<long long>(done), static_cast<long long>(total),
               static_cast<double>(tokens) * rate, static_cast<double>(bytes) * rate / 1e9);
  std::fflush(stderr);
}

}  // namespace

std::int64_t peak_rss_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) {
    bytes /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", bytes, units[unit]);
  return text;
}

StreamSummary stream_pass(Loader& pipeline, const std::string& label, std::int64_t epoch,
                          bool progress) {
  const std::int64_t total = pipeline.plan(epoch).num_batches();
  const PipelineMetrics before = pipeline.metrics();
  const auto start = std::chrono::steady_clock::now();
  const bool tty = progress && ::isatty(STDERR_FILENO);
  pipeline.start_epoch(epoch);
  StreamSummary summary;
  summary.label = label;
  auto last_draw = start;
  while (auto lease = pipeline.next()) {
    ++summary.batches;
    summary.tokens += lease->tokens;
    lease.reset();  // a trainer would use the batch here; returning it lets the pool reuse it
    const auto now = std::chrono::steady_clock::now();
    if (progress && (now - last_draw > std::chrono::milliseconds(tty ? 100 : 2000) ||
                     summary.batches == total)) {
      const PipelineMetrics m = pipeline.metrics();
      draw_bar(label, summary.batches, total, seconds_since(start), summary.tokens,
               m.hidden_bytes - before.hidden_bytes);
      if (!tty) std::fprintf(stderr, "\n");
      last_draw = now;
    }
  }
  if (progress && tty) std::fprintf(stderr, "\n");
  const PipelineMetrics after = pipeline.metrics();
  summary.seconds = seconds_since(start);
  summary.hidden_bytes = after.hidden_bytes - before.hidden_bytes;
  summary.first_batch_seconds = after.first_batch_seconds;
  summary.consumer_wait_seconds = after.consumer_wait_seconds - before.consumer_wait_seconds;
  summary.pool_bytes = pipeline.pool_bytes();
  summary.extra_buffers = after.extra_buffers;
  summary.pinned = after.pinned;
  for (std::size_t r = 0; r < summary.dropped.size(); ++r) {
    summary.dropped[r] = after.dropped[r] - before.dropped[r];
  }
  return summary;
}

void print_summary(const StreamSummary& s) {
  const double rate = s.seconds > 0 ? 1.0 / s.seconds : 0;
  std::printf("%s: %lld batches, %lld tokens in %.2f s\n", s.label.c_str(),
              static_cast<long long>(s.batches), static_cast<long long>(s.tokens), s.seconds);
  std::printf("  throughput       %.0f tokens/s, %.2f GB/s of hidden states\n",
              static_cast<double>(s.tokens) * rate,
              static_cast<double>(s.hidden_bytes) * rate / 1e9);
  std::printf("  first batch      %.3f s\n", s.first_batch_seconds);
  std::printf("  consumer waited  %.3f s (%.0f%% of the pass)\n", s.consumer_wait_seconds,
              s.seconds > 0 ? 100.0 * s.consumer_wait_seconds / s.seconds : 0.0);
  std::printf("  batch memory     %s in the pool%s%s\n",
              human_bytes(static_cast<double>(s.pool_bytes)).c_str(), s.pinned ? " (pinned)" : "",
              s.extra_buffers ? " + extra buffers" : "");
  std::string drops;
  for (std::size_t r = 0; r < s.dropped.size(); ++r) {
    if (s.dropped[r] == 0) continue;
    drops += (drops.empty() ? "" : ", ") + std::to_string(s.dropped[r]) + " " +
             drop_reason_name(static_cast<DropReason>(r));
  }
  std::printf("  samples dropped  %s\n", drops.empty() ? "none" : drops.c_str());
}

std::string summary_json(const StreamSummary& s) { return stats_json(stats_tree(s)).dump(); }

}  // namespace draftfeed::cli
