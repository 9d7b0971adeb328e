#include "rewrite_progress.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "skip_report.h"

namespace draftfeed::cli {

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f GB", bytes / 1e9);
  return text;
}

double byte_ratio(std::uint64_t after, std::uint64_t before) {
  return before > 0 ? static_cast<double>(after) / static_cast<double>(before) : 0.0;
}

namespace {

void draw(const char* verb, const CacheRewriteProgress& p, std::int64_t total, double seconds) {
  constexpr int kWidth = 30;
  const std::int64_t done = p.rows_done.load();
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<std::size_t>(std::min(filled, kWidth)), '#');
  bar.resize(kWidth, '.');
  const double before = static_cast<double>(p.bytes_before.load());
  std::fprintf(stderr, "\r%s [%s] %lld/%lld rows  %s -> %s  %.0f MB/s  ", verb, bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total),
               gigabytes(before).c_str(),
               gigabytes(static_cast<double>(p.bytes_after.load())).c_str(),
               seconds > 0 ? before / 1e6 / seconds : 0.0);
  std::fflush(stderr);
}

}  // namespace

void run_with_progress(const char* verb, std::int64_t total, bool show,
                       CacheRewriteProgress& progress, const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error;
  std::atomic<bool> finished{false};
  std::thread worker([&] {
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
    finished = true;
  });
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (show && !finished.load()) {
    draw(verb, progress, total, seconds());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  worker.join();
  if (show) {
    draw(verb, progress, total, seconds());
    std::fprintf(stderr, "\n");
  }
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    // Only the writer lock ends a rewrite with a timeout (a locked file is a counted row).
    if (e.kind() == ErrorKind::kTimeout) {
      throw Error(e.kind(), std::string(e.what()) + " (--lock-wait SECONDS waits for it)");
    }
    throw;
  }
}

void add_rewrite_json(nlohmann::json& j, const CacheRewriteReport& report) {
  j["rows"] = report.rows;
  add_skipped_json(j, report.skipped, report.examples);
  j["bytes_before"] = report.bytes_before;
  j["bytes_after"] = report.bytes_after;
  j["ratio"] = byte_ratio(report.bytes_after, report.bytes_before);
  j["seconds"] = report.seconds;
  j["threads"] = report.threads;
  j["lock_wait_seconds"] = report.lock_wait_seconds;
}

void print_rewrite_bytes(const CacheRewriteReport& report, const std::string& extra) {
  std::printf("bytes: %s -> %s (%.1f%%%s) in %.2f s on %u threads\n",
              gigabytes(static_cast<double>(report.bytes_before)).c_str(),
              gigabytes(static_cast<double>(report.bytes_after)).c_str(),
              100.0 * byte_ratio(report.bytes_after, report.bytes_before), extra.c_str(),
              report.seconds, report.threads);
  if (report.lock_wait_seconds >= 0.5) {
    std::printf("waited %.1f s for another rewrite's writer lock\n", report.lock_wait_seconds);
  }
}

}  // namespace draftfeed::cli
