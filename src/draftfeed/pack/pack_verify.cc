#include "draftfeed/pack/pack_verify.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "draftfeed/common/run_workers.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

namespace {

struct Tally {
  ScanCounts counts{};
  ScanExamples examples;
  std::uint64_t bytes = 0;
  std::int64_t compressed = 0;
  std::int64_t packed_ok = 0;
  std::int64_t fallbacks = 0;
  std::vector<ScanExample> fallback_examples;
};

// Whether the row's per-sample file in `files` is there and valid, as the loader's fallback.
bool file_is_valid(const CacheStore* files, std::int64_t row, const RowIds& ids) {
  if (files == nullptr) return false;
  auto found = files->lookup(row);
  return found.ok() && found.value() && validate_sample(*found.value(), ids, row).ok();
}

void record(Tally& tally, ScanStatus status, std::int64_t row, std::string reason,
            std::size_t max_examples) {
  const auto s = static_cast<std::size_t>(status);
  ++tally.counts[s];
  if (status != ScanStatus::kOk && tally.examples[s].size() < max_examples) {
    tally.examples[s].push_back(ScanExample{row, std::move(reason)});
  }
}

}  // namespace

PackVerifyReport verify_pack(const PackedCache& pack, std::int64_t num_rows,
                             const std::function<RowIds(std::int64_t)>& ids_of_row,
                             unsigned threads, std::size_t max_examples, const CacheStore* files) {
  const auto& samples = pack.manifest().samples;
  threads = threads != 0 ? threads : std::thread::hardware_concurrency();
  threads = std::clamp<unsigned>(
      threads, 1,
      static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>(samples.size(), 4096))));
  std::vector<Tally> tallies(threads);
  std::atomic<std::size_t> next{0};
  const auto start = std::chrono::steady_clock::now();
  run_workers(threads, [&](unsigned index, const std::atomic<bool>& stop) {
    Tally& tally = tallies[index];
    for (std::size_t i = next++; i < samples.size() && !stop; i = next++) {
      const PackEntry& entry = samples[i];
      tally.bytes += entry.length;
      if (entry.row >= num_rows) {
        record(tally, ScanStatus::kCorrupt, entry.row,
               pack.where(entry) + ": the dataset has " + std::to_string(num_rows) + " rows",
               max_examples);
        continue;
      }
      const RowIds ids = ids_of_row(entry.row);
      ScanStatus status = ScanStatus::kCorrupt;
      std::string problem;
      auto read = pack.read(entry, /*always_check=*/true);
      if (!read.ok()) {
        problem = read.error().what();
      } else {
        if (read.value().decoded) ++tally.compressed;
        const SampleCheck check = validate_sample(read.value().sample, ids, entry.row);
        status = scan_status_of(check.problem);
        if (!check.ok()) problem = pack.where(entry) + ": " + check.message;
      }
      if (status == ScanStatus::kOk) {
        ++tally.packed_ok;
      } else if (file_is_valid(files, entry.row, ids)) {
        // What the loader reads instead: the row is whole.
        status = ScanStatus::kOk;
        ++tally.fallbacks;
        if (tally.fallback_examples.size() < max_examples) {
          tally.fallback_examples.push_back(ScanExample{entry.row, problem});
        }
      }
      record(tally, status, entry.row, problem, max_examples);
    }
  });
  PackVerifyReport report;
  report.samples = static_cast<std::int64_t>(samples.size());
  report.shards = static_cast<std::int64_t>(pack.manifest().shards.size());
  report.scan.rows = report.samples;
  report.scan.threads = threads;
  report.scan.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (Tally& tally : tallies) {
    report.scan.bytes += tally.bytes;
    report.compressed += tally.compressed;
    report.packed_ok += tally.packed_ok;
    report.fallbacks += tally.fallbacks;
    for (ScanExample& e : tally.fallback_examples) report.fallback_examples.push_back(std::move(e));
    merge_by_status(report.scan.counts, report.scan.examples, tally.counts, tally.examples);
  }
  keep_lowest_examples(report.scan.examples, max_examples);
  std::sort(report.fallback_examples.begin(), report.fallback_examples.end(),
            [](const ScanExample& a, const ScanExample& b) { return a.row < b.row; });
  if (report.fallback_examples.size() > max_examples) report.fallback_examples.resize(max_examples);
  return report;
}

}  // namespace draftfeed
