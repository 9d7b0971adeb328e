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
};

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
                             unsigned threads, std::size_t max_examples) {
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
      auto read = pack.read(entry, /*always_check=*/true);
      if (!read.ok()) {
        record(tally, ScanStatus::kCorrupt, entry.row, read.error().what(), max_examples);
        continue;
      }
      if (read.value().decoded) ++tally.compressed;
      const SampleCheck check =
          validate_sample(read.value().sample, ids_of_row(entry.row), entry.row);
      record(tally, scan_status_of(check.problem), entry.row,
             check.ok() ? std::string() : pack.where(entry) + ": " + check.message, max_examples);
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
    merge_by_status(report.scan.counts, report.scan.examples, tally.counts, tally.examples);
  }
  keep_lowest_examples(report.scan.examples, max_examples);
  return report;
}

}  // namespace draftfeed
