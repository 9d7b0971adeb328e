#include "draftfeed/hidden/fp8_convert.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "draftfeed/common/run_workers.h"
#include "draftfeed/hidden/fp8_quantize.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

namespace {

struct ThreadTally {
  CacheConvertReport report;  // counts and examples of this thread's rows
};

void skip(ThreadTally& tally, ScanStatus status, std::int64_t row, const std::string& reason,
          std::size_t max_examples) {
  tally.report.skip(status, row, reason, max_examples);
}

// The row's valid FP8 file in `store`, if there is one.
std::optional<HiddenStateSample> valid_fp8(const CacheStore& store, std::int64_t row,
                                           const RowIds& ids) {
  auto found = store.lookup(row);
  if (!found.ok() || !found.value()) return std::nullopt;
  const HiddenStateSample& sample = *found.value();
  if (sample.hidden_states.dtype != DType::kF8E4M3) return std::nullopt;
  if (!validate_sample(sample, ids, row).ok()) return std::nullopt;
  return sample;
}

// The same tensors written again (a copy of an FP8 file in the package's canonical layout).
std::uint64_t copy_sample(const std::string& path, const HiddenStateSample& sample,
                          const SafetensorsWriteOptions& options) {
  std::vector<TensorToWrite> tensors;
  std::uint64_t bytes = 0;
  for (const TensorView& view : sample.file->tensors()) {
    tensors.push_back(TensorToWrite{view.name, view.dtype, view.shape, view.bytes()});
    bytes += view.nbytes;
  }
  const auto* metadata = sample.file->has_metadata() ? &sample.file->metadata() : nullptr;
  write_safetensors(path, tensors, metadata, options);
  return 8 + safetensors_header(tensors, metadata).size() + bytes;
}

// Moves `from` to `to` (same folder tree, so a rename). Throws Error(kIo) naming both.
void move_file(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot move " + from + " to " + to + ": " + ec.message());
}

void remove_file(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot remove " + path + ": " + ec.message());
}

// `relayout`: in place with a layout asked for (a store writing that layout), else null.
void convert_row(const CacheStore& source, const CacheStore* target, const CacheStore* relayout,
                 std::int64_t row, const RowIds& ids, const CacheConvertOptions& options,
                 ThreadTally& tally, CacheRewriteProgress* progress) {
  CacheConvertReport& report = tally.report;
  auto found = source.lookup(row);
  if (!found.ok()) {
    const Error& error = found.error();
    skip(tally, error.kind() == ErrorKind::kTimeout ? ScanStatus::kLocked : ScanStatus::kCorrupt,
         row, error.what(), options.rewrite.max_examples);
    return;
  }
  if (!found.value()) {
    ++report.missing;
    return;
  }
  const HiddenStateSample& sample = *found.value();
  const SampleCheck check = validate_sample(sample, ids, row);
  if (!check.ok()) {
    skip(tally, scan_status_of(check.problem), row, check.message, options.rewrite.max_examples);
    return;
  }
  const std::uint64_t before = sample.file->file_size();
  std::uint64_t after = 0;
  SafetensorsWriteOptions write;
  // In place, the new file replaces the only copy: it is on disk before the rename, whatever
  // --fsync says (after a power loss the row is then the old file or the new one, never empty).
  write.fsync = options.fsync || target == nullptr;
  const bool is_fp8 = sample.hidden_states.dtype == DType::kF8E4M3;
  if (target == nullptr) {
    // In place: where the file is, or where the layout asked for puts it.
    const std::string& here = sample.file->path();
    const std::string there = relayout != nullptr ? relayout->path_for_writing(row) : here;
    if (is_fp8) {
      ++report.already_fp8;
      after = before;
      if (there != here) {
        move_file(here, there);
        ++report.moved;
      }
    } else {
      after = write_fp8_sample(there, sample, write).bytes;
      if (there != here) remove_file(here);  // the new file is complete: the old one goes
      ++report.converted;
    }
  } else if (const auto existing = valid_fp8(*target, row, ids)) {
    ++report.already_fp8;
    after = existing->file->file_size();
  } else if (is_fp8) {
    after = copy_sample(target->path_for_writing(row), sample, write);
    ++report.copied;
  } else {
    after = write_fp8_sample(target->path_for_writing(row), sample, write).bytes;
    ++report.converted;
  }
  report.bytes_before += before;
  report.bytes_after += after;
  if (progress != nullptr) {
    progress->bytes_before += before;
    progress->bytes_after += after;
  }
}

}  // namespace

CacheConvertReport convert_cache_to_fp8(const CacheStore& source, std::int64_t begin,
                                        std::int64_t end,
                                        const std::function<RowIds(std::int64_t)>& ids_of_row,
                                        const CacheConvertOptions& options,
                                        CacheRewriteProgress* progress) {
  options.validate();
  // The folder written is locked until the conversion ends.
  const CacheRewrite rewrite(source.root(), options.rewrite, "draftfeed quantize");
  std::optional<CacheStore> target;
  if (!rewrite.in_place()) {
    CacheStoreOptions target_options = source.options();
    target_options.root = rewrite.root();
    target_options.lock_mode = LockMode::kProbe;
    target_options.layout = options.layout.value_or(CacheLayout::kFlat);
    target.emplace(target_options);
  }
  std::optional<CacheStore> relayout;
  if (rewrite.in_place() && options.layout) {
    CacheStoreOptions relayout_options = source.options();
    relayout_options.layout = *options.layout;
    relayout.emplace(relayout_options);
  }

  const std::int64_t rows = std::max<std::int64_t>(0, end - begin);
  const unsigned threads = options.rewrite.thread_count(rows);
  std::vector<ThreadTally> tallies(threads);
  std::atomic<std::int64_t> next{begin};
  run_workers(threads, [&](unsigned index, const std::atomic<bool>& stop) {
    for (std::int64_t row = next++; row < end && !stop; row = next++) {
      convert_row(source, target ? &*target : nullptr, relayout ? &*relayout : nullptr, row,
                  ids_of_row(row), options, tallies[index], progress);
      if (progress != nullptr) ++progress->rows_done;
    }
  });

  CacheConvertReport report;
  report.rows = rows;
  for (auto& tally : tallies) {
    CacheConvertReport& t = tally.report;
    report.converted += t.converted;
    report.already_fp8 += t.already_fp8;
    report.moved += t.moved;
    report.copied += t.copied;
    report.missing += t.missing;
    report.merge(t);
  }
  keep_lowest_examples(report.examples, options.rewrite.max_examples);
  rewrite.finish(report, threads);
  return report;
}

}  // namespace draftfeed
