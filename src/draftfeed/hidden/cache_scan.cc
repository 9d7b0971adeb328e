#include "draftfeed/hidden/cache_scan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <iterator>
#include <mutex>
#include <thread>

#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/run_workers.h"

// DRAFTFEED_X86: as cpu_features.cc, whose cpu_has_avx2() chooses the kernel.
#if defined(DRAFTFEED_X86)
#include <immintrin.h>
#define DRAFTFEED_SCAN_X86 1
#endif

namespace draftfeed {

namespace {

// Rows are handed out in chunks so threads touch neighbouring files and the counter stays cold.
constexpr std::int64_t kChunkRows = 8;

struct ThreadTally {
  std::array<std::int64_t, kScanStatusCount> counts{};
  std::array<std::int64_t, kCacheLayoutCount> layouts{};
  std::array<std::vector<ScanExample>, kScanStatusCount> examples;
  std::uint64_t bytes = 0;
  std::vector<std::uint8_t> copy_buffer;  // kMemcpy and kPread only
  std::size_t copy_at = 0;                // kPread: where the next file goes in copy_buffer
  std::uint64_t read_checksum = 0;        // kRead only
};

// The read-only baseline reads every byte of [data, data + size) once and folds it into a
// checksum: the XOR of its 8-byte words in native (little-endian) order, the tail zero-padded. The
// bound must be at least as fast as any scan it bounds, so it reads as the finiteness scan does
// (finite.cc): four 256-bit loads per step with AVX2 where the CPU has it, else 8-byte words with
// four independent accumulators (which the compiler vectorises with SSE2).
std::uint64_t read_words_scalar(const std::uint8_t* data, std::size_t size, std::size_t i) {
  std::uint64_t acc[4] = {0, 0, 0, 0};
  for (; i + 32 <= size; i += 32) {
    for (std::size_t k = 0; k < 4; ++k) {
      std::uint64_t word;
      std::memcpy(&word, data + i + 8 * k, 8);
      acc[k] ^= word;
    }
  }
  std::uint64_t tail = 0;
  for (std::size_t k = 0; i + k < size; ++k) {
    tail ^= static_cast<std::uint64_t>(data[i + k]) << (8 * (k % 8));
  }
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ tail;
}

#ifdef DRAFTFEED_SCAN_X86
__attribute__((target("avx2"))) std::uint64_t read_words_avx2(const std::uint8_t* data,
                                                              std::size_t size) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  std::size_t i = 0;
  for (; i + 128 <= size; i += 128) {
    const auto* v = reinterpret_cast<const __m256i*>(data + i);
    a = _mm256_xor_si256(a, _mm256_loadu_si256(v));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(v + 1));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(v + 2));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(v + 3));
  }
  alignas(32) std::uint64_t words[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(words),
                     _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
  // Before the scalar tail and the caller's code (batch/vector_store.h's vector_kernel_done says
  // why; GCC inserts it only sometimes).
  _mm256_zeroupper();
  return words[0] ^ words[1] ^ words[2] ^ words[3] ^ read_words_scalar(data, size, i);
}

#endif  // DRAFTFEED_SCAN_X86

std::uint64_t read_every_byte(const std::uint8_t* data, std::size_t size) {
#ifdef DRAFTFEED_SCAN_X86
  if (cpu_has_avx2()) return read_words_avx2(data, size);
#endif
  return read_words_scalar(data, size, 0);
}

// Why a file the scan read through its mapping could not be read whole.
std::string shrank(const MappedFile& mapping) {
  return mapping.path() +
         ": the file shrank while it was read (truncated by another process: SIGBUS on the "
         "mapping)";
}

void record(ThreadTally& tally, ScanStatus status, std::int64_t row, const std::string& reason,
            std::size_t max_examples) {
  const auto index = static_cast<std::size_t>(status);
  ++tally.counts[index];
  // A thread sees its rows in increasing order, so its first examples are its lowest rows.
  if (status != ScanStatus::kOk && status != ScanStatus::kMissing &&
      tally.examples[index].size() < max_examples) {
    tally.examples[index].push_back(ScanExample{row, reason});
  }
}

void scan_row(const CacheStore& store, std::int64_t row, const RowIds& ids,
              const CacheScanOptions& options, ThreadTally& tally) {
  // The read baseline opens files as the loader does (descriptor kept, header-only mapping).
  auto found = store.lookup(row, options.mode == ScanMode::kPread ? kMapForRowReads : MapOptions{});
  if (!found.ok()) {
    const Error& error = found.error();
    record(tally, error.kind() == ErrorKind::kTimeout ? ScanStatus::kLocked : ScanStatus::kCorrupt,
           row, error.what(), options.max_examples);
    return;
  }
  if (!found.value()) {
    record(tally, ScanStatus::kMissing, row, "", options.max_examples);
    return;
  }
  const HiddenStateSample& sample = *found.value();
  tally.bytes += sample.file->file_size();
  const bool flat = sample.file->path() == cache_file_path(store.root(), row, CacheLayout::kFlat);
  ++tally.layouts[static_cast<std::size_t>(flat ? CacheLayout::kFlat : CacheLayout::kSharded)];
  if (options.mode == ScanMode::kMemcpy) {
    const auto& mapping = sample.file->mapping();
    if (tally.copy_buffer.size() < mapping->size()) tally.copy_buffer.resize(mapping->size());
    const bool ok = guarded_copy(tally.copy_buffer.data(), mapping->data(), mapping->size());
    record(tally, ok ? ScanStatus::kOk : ScanStatus::kCorrupt, row, ok ? "" : shrank(*mapping),
           options.max_examples);
    return;
  }
  if (options.mode == ScanMode::kPread) {
    // Destinations far larger than the caches, as a loader's batches are.
    constexpr std::size_t kRing = std::size_t{64} << 20;
    const auto& mapping = sample.file->mapping();
    if (tally.copy_buffer.size() < kRing) tally.copy_buffer.resize(kRing);
    std::size_t done = 0;
    bool ok = true;
    while (ok && done < mapping->size()) {
      if (tally.copy_at == kRing) tally.copy_at = 0;
      const std::size_t part = std::min(mapping->size() - done, kRing - tally.copy_at);
      auto got = mapping->read_at(done, part, tally.copy_buffer.data() + tally.copy_at);
      ok = got.ok() && got.value() == part;
      done += part;
      tally.copy_at += part;
    }
    record(tally, ok ? ScanStatus::kOk : ScanStatus::kCorrupt, row,
           ok ? "" : mapping->path() + ": could not be read whole", options.max_examples);
    return;
  }
  if (options.mode == ScanMode::kRead) {
    const auto& mapping = sample.file->mapping();
    std::uint64_t checksum = 0;
    const bool ok =
        guard_mapped_reads([&] { checksum = read_every_byte(mapping->data(), mapping->size()); });
    tally.read_checksum ^= checksum;
    record(tally, ok ? ScanStatus::kOk : ScanStatus::kCorrupt, row, ok ? "" : shrank(*mapping),
           options.max_examples);
    return;
  }
  const SampleCheck check = validate_sample(sample, ids, row);
  record(tally, scan_status_of(check.problem), row, check.message, options.max_examples);
}

}  // namespace

constexpr std::array<EnumName<ScanStatus>, 6> kScanStatusNames = {{
    {ScanStatus::kOk, "ok"},
    {ScanStatus::kMissing, "missing"},
    {ScanStatus::kCorrupt, "corrupt"},
    {ScanStatus::kMismatched, "mismatched"},
    {ScanStatus::kNonFinite, "nonfinite"},
    {ScanStatus::kLocked, "locked"},
}};
static_assert(kScanStatusNames.size() == kScanStatusCount &&
              names_each_value_in_order(kScanStatusNames));

const char* scan_status_name(ScanStatus status) { return enum_name(status, kScanStatusNames); }

void merge_by_status(ScanCounts& counts, ScanExamples& examples, const ScanCounts& thread_counts,
                     ScanExamples& thread_examples) {
  for (std::size_t s = 0; s < kScanStatusCount; ++s) {
    counts[s] += thread_counts[s];
    examples[s].insert(examples[s].end(), std::make_move_iterator(thread_examples[s].begin()),
                       std::make_move_iterator(thread_examples[s].end()));
    thread_examples[s].clear();
  }
}

void keep_lowest_examples(ScanExamples& examples, std::size_t max_examples) {
  for (auto& of_status : examples) {
    std::sort(of_status.begin(), of_status.end(),
              [](const ScanExample& a, const ScanExample& b) { return a.row < b.row; });
    if (of_status.size() > max_examples) of_status.resize(max_examples);
  }
}

bool CacheScanReport::clean() const {
  return count(ScanStatus::kCorrupt) == 0 && count(ScanStatus::kMismatched) == 0 &&
         count(ScanStatus::kNonFinite) == 0 && count(ScanStatus::kLocked) == 0;
}

ScanStatus scan_status_of(SampleProblem problem) {
  switch (problem) {
    case SampleProblem::kNone:
      return ScanStatus::kOk;
    case SampleProblem::kTokenMismatch:
    case SampleProblem::kLengthMismatch:
      return ScanStatus::kMismatched;
    case SampleProblem::kNonFinite:
      return ScanStatus::kNonFinite;
    default:
      return ScanStatus::kCorrupt;
  }
}

CacheScanReport scan_cache(const CacheStore& store, std::int64_t num_rows,
                           const std::function<RowIds(std::int64_t)>& ids_of_row,
                           const CacheScanOptions& options) {
  unsigned threads = options.threads != 0 ? options.threads : std::thread::hardware_concurrency();
  if (threads == 0) threads = 1;
  const std::int64_t chunks = (num_rows + kChunkRows - 1) / kChunkRows;
  if (static_cast<std::int64_t>(threads) > chunks)
    threads = static_cast<unsigned>(std::max<std::int64_t>(chunks, 1));

  std::vector<ThreadTally> tallies(threads);
  std::atomic<std::int64_t> next_chunk{0};
  const auto start = std::chrono::steady_clock::now();
  run_workers(threads, [&](unsigned index, const std::atomic<bool>& stop) {
    ThreadTally& tally = tallies[index];
    for (std::int64_t chunk = next_chunk++; chunk < chunks && !stop; chunk = next_chunk++) {
      const std::int64_t end = std::min(num_rows, (chunk + 1) * kChunkRows);
      for (std::int64_t row = chunk * kChunkRows; row < end; ++row) {
        if (options.skip_row && options.skip_row(row)) continue;
        scan_row(store, row, ids_of_row(row), options, tally);
      }
    }
  });

  CacheScanReport report;
  report.rows = num_rows;
  report.threads = threads;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& tally : tallies) {
    report.bytes += tally.bytes;
    report.read_checksum ^= tally.read_checksum;
    for (std::size_t l = 0; l < report.layouts.size(); ++l) report.layouts[l] += tally.layouts[l];
    merge_by_status(report.counts, report.examples, tally.counts, tally.examples);
  }
  keep_lowest_examples(report.examples, options.max_examples);
  return report;
}

}  // namespace draftfeed
