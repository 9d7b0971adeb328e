#include "draftfeed/hidden/cache_rewrite.h"

#include <algorithm>
#include <filesystem>
#include <thread>

namespace draftfeed {

namespace {

FolderLock lock_folder(const std::string& root, const std::string& what,
                       std::chrono::duration<double> wait) {
  auto lock = FolderLock::acquire(root, what, wait);
  if (!lock.ok()) throw lock.error();
  return std::move(lock).value();
}

const std::string& created(const std::string& root) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw Error(ErrorKind::kIo, root + ": cannot create the folder: " + ec.message());
  return root;
}

}  // namespace

void CacheRewriteOptions::validate() const {
  require(threads <= 4096, ErrorKind::kInvalidArgument,
          "threads must be between 0 and 4096, got " + std::to_string(threads));
  require(lock_wait.count() >= 0 && lock_wait.count() <= 7 * 24 * 3600.0,
          ErrorKind::kInvalidArgument,
          "lock_wait must be between 0 and a week of seconds, got " +
              std::to_string(lock_wait.count()));
}

unsigned CacheRewriteOptions::thread_count(std::int64_t work) const {
  unsigned n = threads != 0 ? threads : std::thread::hardware_concurrency();
  n = std::max(1U, n);
  if (work > 0) n = static_cast<unsigned>(std::min<std::int64_t>(n, work));
  return n;
}

void CacheRewriteReport::skip(ScanStatus status, std::int64_t row, std::string reason,
                              std::size_t max_examples) {
  const auto s = static_cast<std::size_t>(status);
  ++skipped[s];
  if (examples[s].size() < max_examples) examples[s].push_back(ScanExample{row, std::move(reason)});
}

std::int64_t CacheRewriteReport::skipped_total() const {
  std::int64_t total = 0;
  for (const auto n : skipped) total += n;
  return total;
}

void CacheRewriteReport::merge(CacheRewriteReport& other) {
  bytes_before += other.bytes_before;
  bytes_after += other.bytes_after;
  merge_by_status(skipped, examples, other.skipped, other.examples);
}

CacheRewrite::CacheRewrite(const std::string& source_root, const CacheRewriteOptions& options,
                           const std::string& what)
    : in_place_(options.target_root.empty()),
      root_(in_place_ ? source_root : options.target_root),
      start_(std::chrono::steady_clock::now()),
      lock_((options.validate(), lock_folder(created(root_), what, options.lock_wait))) {}

void CacheRewrite::finish(CacheRewriteReport& report, unsigned threads) const {
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  report.threads = threads;
  report.lock_wait_seconds = lock_.waited_seconds();
}

}  // namespace draftfeed
