#include "draftfeed/pack/pack_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "draftfeed/common/run_workers.h"
#include "draftfeed/common/xxh64.h"
#include "draftfeed/hidden/validate.h"
#include "draftfeed/pack/durable_file.h"
#include "draftfeed/pack/pack_manifest.h"
#include "draftfeed/pack/packed_cache.h"
#include "draftfeed/pack/shard_layout.h"

namespace draftfeed {

namespace {

// What a worker made of one row.
struct RowResult {
  std::optional<EncodedSample> sample;
  std::string source_path;  // the per-sample file read
  CacheLayout layout = CacheLayout::kFlat;
  bool missing = false;
  ScanStatus status = ScanStatus::kOk;  // else why it stays per-sample
  std::string reason;
  // A row the manifest names already: left there (and, in place, its leftover per-sample file
  // removed when `remove_leftover`), or, when `sample` is set, packed again from its file.
  bool was_packed = false;
  bool remove_leftover = false;
};

CacheLayout layout_of(const CacheStore& store, std::int64_t row, const std::string& path) {
  return path == cache_file_path(store.root(), row, CacheLayout::kSharded) ? CacheLayout::kSharded
                                                                           : CacheLayout::kFlat;
}

RowResult encode_row(const CacheStore& source, std::int64_t row, const RowIds& ids,
                     const PackOptions& options) {
  RowResult result;
  auto found = source.lookup(row);
  if (!found.ok()) {
    result.status =
        found.error().kind() == ErrorKind::kTimeout ? ScanStatus::kLocked : ScanStatus::kCorrupt;
    result.reason = found.error().what();
    return result;
  }
  if (!found.value()) {
    result.missing = true;
    return result;
  }
  const HiddenStateSample& sample = *found.value();
  const SampleCheck check = validate_sample(sample, ids, row);
  if (!check.ok()) {
    result.status = scan_status_of(check.problem);
    result.reason = check.message;
    return result;
  }
  result.source_path = sample.path();
  result.layout = layout_of(source, row, result.source_path);
  try {
    result.sample = encode_pack_sample(row, *sample.file, options.compress, options.codec);
  } catch (const Error& error) {
    result.status = ScanStatus::kCorrupt;
    result.reason = error.what();
  }
  return result;
}

// Why the entry's packed sample would not give the row (read back: checksum, parts against its
// header, then every check `draftfeed verify` makes, values included), or nothing when it is valid.
std::optional<std::string> packed_problem(const PackedCache& pack, const PackEntry& entry,
                                          const RowIds& ids) {
  auto read = pack.read(entry, /*always_check=*/true);
  if (!read.ok()) return read.error().what();
  const SampleCheck check = validate_sample(read.value().sample, ids, entry.row);
  if (!check.ok()) return pack.where(entry) + ": " + check.message;
  return std::nullopt;
}

// A row the manifest names, in place: its per-sample file, when one is there, goes only once the
// packed sample is valid; otherwise the row is packed again from the file (when the file is
// valid), or the file stays.
RowResult packed_row(const CacheStore& source, const PackedCache& pack, const PackEntry& entry,
                     const RowIds& ids, const PackOptions& options) {
  RowResult result;
  result.was_packed = true;
  auto found = source.lookup(entry.row);
  if (found.ok() && !found.value()) return result;  // nothing left beside the pack
  if (!found.ok() && found.error().kind() == ErrorKind::kTimeout) return result;  // being written
  const auto problem = packed_problem(pack, entry, ids);
  if (!problem) {
    result.remove_leftover = true;
    return result;
  }
  RowResult again = encode_row(source, entry.row, ids, options);
  again.was_packed = true;
  if (!again.sample && !again.missing) {
    again.reason =
        "its packed sample does not read (" + *problem + ") and its file neither: " + again.reason;
  }
  return again;
}

void remove_quietly(const std::string& path) { ::unlink(path.c_str()); }

void remove_row_files(const std::string& root, std::int64_t row) {
  for (int l = 0; l < kCacheLayoutCount; ++l) {
    remove_quietly(cache_file_path(root, row, static_cast<CacheLayout>(l)));
  }
}

// Empty shard folders (cache_layout.h) left once their files went into the pack.
void remove_empty_shard_folders(const std::string& root) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    if (!entry.is_symlink() && entry.is_directory() &&
        is_shard_folder_name(entry.path().filename().string())) {
      std::error_code remove_error;
      if (std::filesystem::is_empty(entry.path(), remove_error)) {
        std::filesystem::remove(entry.path(), remove_error);
      }
    }
  }
}

// The folder the rewrite locked is still the one at its path: files are removed by name, so a
// folder swapped in meanwhile (renamed over) must not have its files removed.
void check_same_folder(const CacheRewrite& rewrite) {
  struct stat st {};
  const FileIdentity& locked = rewrite.lock().folder_identity();
  if (::stat(rewrite.root().c_str(), &st) != 0 ||
      static_cast<std::uint64_t>(st.st_dev) != locked.device || st.st_ino != locked.inode) {
    throw Error(ErrorKind::kRuntime,
                rewrite.root() +
                    " is no longer the folder this pack locked (moved or replaced while it ran): "
                    "stopped before removing any file by name");
  }
}

class ShardBuilder {
 public:
  ShardBuilder(const CacheRewrite& rewrite, PackManifest& manifest, FileStamp manifest_stamp,
               const std::function<RowIds(std::int64_t)>& ids_of_row, const PackOptions& options,
               PackReport& report, CacheRewriteProgress* progress)
      : rewrite_(rewrite),
        root_(rewrite.root()),
        manifest_(manifest),
        stamp_(manifest_stamp),
        ids_of_row_(ids_of_row),
        options_(options),
        report_(report),
        progress_(progress) {
    for (std::size_t i = 0; i < manifest_.samples.size(); ++i) {
      index_of_row_[manifest_.samples[i].row] = i;
    }
  }

  void add(RowResult&& result, std::uint64_t file_bytes) {
    source_bytes_ += file_bytes;
    pending_.push_back(std::move(result));
  }
  std::uint64_t source_bytes() const { return source_bytes_; }
  std::size_t samples() const { return pending_.size(); }

  // Writes the shard; then, when its turn has come (kManifestRewriteFactor), the manifest.
  void flush() {
    if (pending_.empty()) return;
    const auto index = static_cast<std::uint32_t>(manifest_.shards.size());
    const std::string file = pack_shard_name(index);
    std::vector<const EncodedSample*> samples;
    samples.reserve(pending_.size());
    for (const RowResult& r : pending_) samples.push_back(&*r.sample);
    const std::string header = pack_shard_header(samples, manifest_.codec);
    const std::uint64_t header_size = header.size();
    std::uint8_t size_field[8];
    std::memcpy(size_field, &header_size, 8);
    std::vector<std::span<const std::uint8_t>> pieces;
    pieces.emplace_back(size_field, 8);
    pieces.emplace_back(reinterpret_cast<const std::uint8_t*>(header.data()), header.size());
    std::uint64_t at = 8 + header_size;
    std::vector<PackEntry> entries;
    for (const RowResult& r : pending_) {
      const EncodedSample& s = *r.sample;
      pieces.emplace_back(s.bytes.data(), s.bytes.size());
      PackEntry e;
      e.row = s.row;
      e.shard = index;
      e.offset = at;
      e.length = s.bytes.size();
      e.checksum = xxh64(s.bytes);
      e.file_bytes = s.file_bytes;
      e.layout = r.layout;
      entries.push_back(e);
      at += s.bytes.size();
    }
    write_file_durably(root_ + "/" + file, pieces);
    manifest_.shards.push_back(PackShard{file, at});
    for (const PackEntry& e : entries) {
      // A row packed again (its old sample was not valid) is named by its new sample only.
      const auto [it, added] = index_of_row_.try_emplace(e.row, manifest_.samples.size());
      if (added) {
        manifest_.samples.push_back(e);
      } else {
        manifest_.samples[it->second] = e;
      }
      unnamed_.push_back(e);
    }
    ++report_.shards;
    report_.packed += static_cast<std::int64_t>(pending_.size());
    report_.bytes_before += source_bytes_;
    report_.bytes_after += at;
    for (const RowResult& r : pending_) {
      report_.hidden_before += r.sample->original_hidden;
      report_.hidden_after += r.sample->stored_hidden;
      if (r.was_packed) ++report_.repacked;
    }
    if (progress_ != nullptr) progress_->bytes_after += at;
    unnamed_bytes_ += at;
    pending_.clear();
    source_bytes_ = 0;
    if (unnamed_bytes_ >= kManifestRewriteFactor * manifest_bytes_) publish();
  }

  // Writes the manifest, naming every shard written so far, then (in place) removes the
  // per-sample files of their samples that read back valid from the shards.
  void publish() {
    if (unnamed_bytes_ == 0) return;
    // A writer that did not take the lock (a file system that keeps locks on one host, with
    // DRAFTFEED_WRITER_LOCK=local on two) may have written the manifest since: never write over
    // rows it named.
    if (pack_manifest_stamp(root_) != stamp_) {
      throw Error(ErrorKind::kRuntime,
                  root_ + "/" + kPackManifestName +
                      " changed while this pack ran (another writer that did not take the "
                      "folder's writer lock?): stopped before writing over it; the rows packed "
                      "before are safe, the per-sample files of the rest are left");
    }
    manifest_bytes_ = write_pack_manifest(root_, manifest_);
    stamp_ = pack_manifest_stamp(root_);
    ++report_.manifest_writes;
    if (rewrite_.in_place()) remove_safe_files();
    unnamed_.clear();
    unnamed_bytes_ = 0;
  }

 private:
  // Each sample just named is read back from its shard and checked as verify checks it; only then
  // does its per-sample file go. One that does not read back keeps its file (the loader reads the
  // file when the packed sample fails).
  void remove_safe_files() {
    check_same_folder(rewrite_);
    PackManifest named;
    named.codec = manifest_.codec;
    named.shards = manifest_.shards;
    named.samples = unnamed_;
    const auto pack = PackedCache::of_manifest(root_, std::move(named));
    const auto& samples = pack->manifest().samples;
    std::vector<std::optional<std::string>> problems(samples.size());
    std::atomic<std::size_t> next{0};
    run_workers(options_.rewrite.thread_count(static_cast<std::int64_t>(samples.size())),
                [&](unsigned, const std::atomic<bool>& stop) {
                  for (std::size_t i = next++; i < samples.size() && !stop; i = next++) {
                    problems[i] = packed_problem(*pack, samples[i], ids_of_row_(samples[i].row));
                  }
                });
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (problems[i]) {
        ++report_.kept;
        report_.skip(ScanStatus::kCorrupt, samples[i].row,
                     "packed, but its sample does not read back (" + *problems[i] +
                         "): its per-sample file stays",
                     options_.rewrite.max_examples);
        continue;
      }
      remove_row_files(root_, samples[i].row);
      ++report_.removed;
    }
    sync_folder(root_);
  }

  const CacheRewrite& rewrite_;
  std::string root_;
  PackManifest& manifest_;
  FileStamp stamp_;  // of the manifest as this pack last read or wrote it
  const std::function<RowIds(std::int64_t)>& ids_of_row_;
  const PackOptions& options_;
  PackReport& report_;
  CacheRewriteProgress* progress_;
  std::unordered_map<std::int64_t, std::size_t> index_of_row_;  // into manifest_.samples
  std::vector<RowResult> pending_;
  std::uint64_t source_bytes_ = 0;
  // Samples in shards written and not yet named by the manifest, and those shards' bytes.
  std::vector<PackEntry> unnamed_;
  std::uint64_t unnamed_bytes_ = 0;
  std::uint64_t manifest_bytes_ = 0;  // as last written by this run
};

}  // namespace

void PackOptions::validate() const {
  rewrite.validate();
  require(shard_bytes > 0 && shard_bytes <= (std::uint64_t{1} << 40), ErrorKind::kInvalidArgument,
          "shard_bytes must be between 1 and 2^40, got " + std::to_string(shard_bytes));
  require(codec.zstd_level >= -7 && codec.zstd_level <= 19, ErrorKind::kInvalidArgument,
          "the zstd level must be between -7 and 19, got " + std::to_string(codec.zstd_level));
}

PackReport pack_cache(const CacheStore& source, std::int64_t begin, std::int64_t end,
                      const std::function<RowIds(std::int64_t)>& ids_of_row,
                      const PackOptions& options, CacheRewriteProgress* progress) {
  options.validate();
  const CacheRewrite rewrite(source.root(), options.rewrite, "draftfeed pack");
  const std::string& root = rewrite.root();
  const bool in_place = rewrite.in_place();
  remove_dead_temporaries(root);
  FileStamp stamp;
  auto existing = read_pack_manifest(root, &stamp);
  if (!existing.ok()) throw existing.error();
  PackManifest manifest = existing.value() ? std::move(*existing.value()) : PackManifest{};
  if (options.compress) manifest.codec = kPlaneCodecName;
  // The pack as it was, to check the samples of rows whose per-sample files are still there.
  const std::shared_ptr<const PackedCache> before =
      in_place && !manifest.samples.empty() ? PackedCache::of_manifest(root, manifest) : nullptr;
  std::unordered_set<std::int64_t> packed_rows;
  for (const PackEntry& e : manifest.samples) packed_rows.insert(e.row);

  PackReport report;
  report.rows = std::max<std::int64_t>(0, end - begin);
  const unsigned threads = options.rewrite.thread_count();
  ShardBuilder shard(rewrite, manifest, stamp, ids_of_row, options, report, progress);
  const std::int64_t window = static_cast<std::int64_t>(threads) * 4;
  std::vector<RowResult> results;
  std::vector<std::int64_t> leftovers;  // rows whose leftover files go (packed samples valid)
  for (std::int64_t first = begin; first < end; first += window) {
    const std::int64_t last = std::min(end, first + window);
    results.assign(static_cast<std::size_t>(last - first), RowResult{});
    std::atomic<std::int64_t> next{first};
    run_workers(threads, [&](unsigned, const std::atomic<bool>& stop) {
      for (std::int64_t row = next++; row < last && !stop; row = next++) {
        RowResult& slot = results[static_cast<std::size_t>(row - first)];
        if (!packed_rows.contains(row)) {
          slot = encode_row(source, row, ids_of_row(row), options);
        } else if (in_place) {
          slot = packed_row(source, *before, *before->find(row), ids_of_row(row), options);
        } else {
          slot.was_packed = true;  // into another folder: the target's pack has it
        }
      }
    });
    for (std::int64_t row = first; row < last; ++row) {
      RowResult& r = results[static_cast<std::size_t>(row - first)];
      if (progress != nullptr) ++progress->rows_done;
      if (r.was_packed && !r.sample) {
        if (r.status != ScanStatus::kOk) {
          ++report.kept;
          report.skip(r.status, row, r.reason, options.rewrite.max_examples);
        } else {
          ++report.already_packed;
          if (r.remove_leftover) leftovers.push_back(row);
        }
        continue;
      }
      if (r.missing) {
        ++report.missing;
        continue;
      }
      if (!r.sample) {
        report.skip(r.status, row, r.reason, options.rewrite.max_examples);
        continue;
      }
      const std::uint64_t file_bytes = r.sample->file_bytes;
      if (progress != nullptr) progress->bytes_before += file_bytes;
      shard.add(std::move(r), file_bytes);
      if (shard.source_bytes() >= options.shard_bytes || shard.samples() >= kMaxShardSamples) {
        shard.flush();
      }
    }
  }
  shard.flush();
  shard.publish();
  if (in_place) {
    // Packed by a run before (killed before it removed them, or written since to repair a packed
    // sample that has since been found valid): the manifest naming the rows is durable and their
    // packed samples were read back valid.
    if (!leftovers.empty()) {
      check_same_folder(rewrite);
      for (const std::int64_t row : leftovers) remove_row_files(root, row);
      report.removed += static_cast<std::int64_t>(leftovers.size());
      sync_folder(root);
    }
    remove_empty_shard_folders(root);
  }
  keep_lowest_examples(report.examples, options.rewrite.max_examples);
  rewrite.finish(report, threads);
  return report;
}

UnpackReport unpack_cache(const std::string& root, const CacheRewriteOptions& options,
                          CacheRewriteProgress* progress) {
  options.validate();
  // In place the pack's own folder is locked (its manifest and shards are removed at the end);
  // into another folder, that folder.
  const CacheRewrite rewrite(root, options, "draftfeed unpack");
  auto opened = PackedCache::open(root);
  if (!opened.ok()) throw opened.error();
  const std::shared_ptr<const PackedCache> pack = opened.value();
  require(pack != nullptr, ErrorKind::kNotFound,
          root + ": no " + std::string(kPackManifestName) + " (not a packed cache)");
  const bool in_place = rewrite.in_place();
  const std::string& out_root = rewrite.root();
  UnpackReport report;
  const auto& samples = pack->manifest().samples;
  report.rows = static_cast<std::int64_t>(samples.size());
  for (const PackShard& s : pack->manifest().shards) report.bytes_before += s.bytes;
  const unsigned threads = options.thread_count();
  std::mutex mutex;
  std::atomic<std::size_t> next{0};
  run_workers(threads, [&](unsigned, const std::atomic<bool>& stop) {
    for (std::size_t i = next++; i < samples.size() && !stop; i = next++) {
      const PackEntry& e = samples[i];
      auto bytes = pack->file_bytes(e);
      if (!bytes.ok()) {
        std::lock_guard<std::mutex> lock(mutex);
        report.skip(ScanStatus::kCorrupt, e.row, bytes.error().what(), options.max_examples);
      } else {
        const std::string path = cache_file_path(out_root, e.row, e.layout);
        std::filesystem::create_directories(std::filesystem::path(path).parent_path());
        const std::span<const std::uint8_t> piece(bytes.value());
        write_file_durably(path, std::span(&piece, 1));
        std::lock_guard<std::mutex> lock(mutex);
        ++report.written;
        report.bytes_after += e.file_bytes;
      }
      if (progress != nullptr) {
        ++progress->rows_done;
        progress->bytes_after += e.file_bytes;
      }
    }
  });
  keep_lowest_examples(report.examples, options.max_examples);
  if (in_place && report.failed() == 0) {
    // Every per-sample file is durable: the manifest goes first (readers fall back to the files),
    // then the shards it named, then any shard file it did not name.
    check_same_folder(rewrite);
    remove_quietly(root + "/" + kPackManifestName);
    sync_folder(root);
    for (const PackShard& s : pack->manifest().shards) remove_quietly(root + "/" + s.file);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
      if (is_pack_shard_name(entry.path().filename().string())) remove_quietly(entry.path());
    }
    sync_folder(root);
    report.removed_pack = true;
  }
  rewrite.finish(report, threads);
  return report;
}

}  // namespace draftfeed
