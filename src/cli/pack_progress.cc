#include "pack_progress.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

namespace draftfeed::cli {

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f GB", bytes / 1e9);
  return text;
}

namespace {

void draw(const char* verb, const PackProgress& p, std::int64_t total, double seconds) {
  constexpr int kWidth = 30;
  const std::int64_t done = p.rows_done.load();
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '#');
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

void run_with_progress(const char* verb, std::int64_t total, bool show, PackProgress& progress,
                       const std::function<void()>& work) {
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
  if (error) std::rethrow_exception(error);
}

}  // namespace draftfeed::cli
