#include "draftfeed/pack/pack_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
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

void remove_quietly(const std::string& path) { ::unlink(path.c_str()); }

// Empty shard folders (cache_layout.h) left once their files went into the pack.
void remove_empty_shard_folders(const std::string& root) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    if (!entry.is_directory() || !is_shard_folder_name(entry.path().filename().string())) continue;
    std::error_code remove_error;
    if (std::filesystem::is_empty(entry.path(), remove_error)) {
      std::filesystem::remove(entry.path(), remove_error);
    }
  }
}

class ShardBuilder {
 public:
  ShardBuilder(std::string root, PackManifest& manifest, bool in_place, PackReport& report,
               PackProgress* progress)
      : root_(std::move(root)),
        manifest_(manifest),
        in_place_(in_place),
        report_(report),
        progress_(progress) {}

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
    manifest_.samples.insert(manifest_.samples.end(), entries.begin(), entries.end());
    ++report_.shards;
    report_.packed += static_cast<std::int64_t>(pending_.size());
    report_.bytes_before += source_bytes_;
    report_.bytes_after += at;
    for (const RowResult& r : pending_) {
      report_.hidden_before += r.sample->original_hidden;
      report_.hidden_after += r.sample->stored_hidden;
    }
    if (progress_ != nullptr) progress_->bytes_after += at;
    for (const RowResult& r : pending_) unnamed_sources_.push_back(r.source_path);
    unnamed_bytes_ += at;
    pending_.clear();
    source_bytes_ = 0;
    if (unnamed_bytes_ >= kManifestRewriteFactor * manifest_bytes_) publish();
  }

  // Writes the manifest, naming every shard written so far, then (in place) removes the
  // per-sample files of their samples.
  void publish() {
    if (unnamed_bytes_ == 0) return;
    manifest_bytes_ = write_pack_manifest(root_, manifest_);
    ++report_.manifest_writes;
    if (in_place_) {
      for (const std::string& path : unnamed_sources_) {
        remove_quietly(path);
        ++report_.removed;
      }
      sync_folder(root_);
    }
    unnamed_sources_.clear();
    unnamed_bytes_ = 0;
  }

 private:
  std::string root_;
  PackManifest& manifest_;
  bool in_place_;
  PackReport& report_;
  PackProgress* progress_;
  std::vector<RowResult> pending_;
  std::uint64_t source_bytes_ = 0;
  // Shards written and not yet named by the manifest: their bytes, their samples' source files.
  std::uint64_t unnamed_bytes_ = 0;
  std::vector<std::string> unnamed_sources_;
  std::uint64_t manifest_bytes_ = 0;  // as last written by this run
};

}  // namespace

std::int64_t PackReport::skipped_total() const {
  std::int64_t total = 0;
  for (const auto n : skipped) total += n;
  return total;
}

PackReport pack_cache(const CacheStore& source, std::int64_t begin, std::int64_t end,
                      const std::function<RowIds(std::int64_t)>& ids_of_row,
                      const PackOptions& options, PackProgress* progress) {
  require(options.shard_bytes > 0, ErrorKind::kInvalidArgument, "shard bytes must be > 0");
  const bool in_place = options.target_root.empty();
  const std::string root = in_place ? source.root() : options.target_root;
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw Error(ErrorKind::kIo, root + ": cannot create the folder: " + ec.message());
  remove_dead_temporaries(root);
  auto existing = read_pack_manifest(root);
  if (!existing.ok()) throw existing.error();
  PackManifest manifest = existing.value() ? std::move(*existing.value()) : PackManifest{};
  if (options.compress) manifest.codec = kPlaneCodecName;
  std::unordered_set<std::int64_t> packed;
  for (const PackEntry& e : manifest.samples) packed.insert(e.row);

  PackReport report;
  report.rows = std::max<std::int64_t>(0, end - begin);
  unsigned threads = options.threads != 0 ? options.threads : std::thread::hardware_concurrency();
  threads = std::max(1U, threads);
  report.threads = threads;
  const auto start = std::chrono::steady_clock::now();
  ShardBuilder shard(root, manifest, in_place, report, progress);
  const std::int64_t window = static_cast<std::int64_t>(threads) * 4;
  std::vector<RowResult> results;
  for (std::int64_t first = begin; first < end; first += window) {
    const std::int64_t last = std::min(end, first + window);
    results.assign(static_cast<std::size_t>(last - first), RowResult{});
    std::atomic<std::int64_t> next{first};
    run_workers(threads, [&](unsigned, const std::atomic<bool>& stop) {
      for (std::int64_t row = next++; row < last && !stop; row = next++) {
        RowResult& slot = results[static_cast<std::size_t>(row - first)];
        if (packed.contains(row)) continue;
        slot = encode_row(source, row, ids_of_row(row), options);
      }
    });
    for (std::int64_t row = first; row < last; ++row) {
      RowResult& r = results[static_cast<std::size_t>(row - first)];
      if (progress != nullptr) ++progress->rows_done;
      if (packed.contains(row)) {
        ++report.already_packed;
        if (in_place) {
          // Packed by a run killed before it removed the per-sample files: the manifest naming
          // the row is durable, so they go now.
          for (int l = 0; l < kCacheLayoutCount; ++l) {
            remove_quietly(cache_file_path(root, row, static_cast<CacheLayout>(l)));
          }
        }
        continue;
      }
      if (r.missing) {
        ++report.missing;
        continue;
      }
      if (!r.sample) {
        const auto s = static_cast<std::size_t>(r.status);
        ++report.skipped[s];
        if (report.examples[s].size() < options.max_examples) {
          report.examples[s].push_back(ScanExample{row, r.reason});
        }
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
  if (in_place) remove_empty_shard_folders(root);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

UnpackReport unpack_cache(const std::string& root, const std::string& target_root, unsigned threads,
                          std::size_t max_examples, PackProgress* progress) {
  auto opened = PackedCache::open(root);
  if (!opened.ok()) throw opened.error();
  const std::shared_ptr<const PackedCache> pack = opened.value();
  require(pack != nullptr, ErrorKind::kNotFound,
          root + ": no " + std::string(kPackManifestName) + " (not a packed cache)");
  const bool in_place = target_root.empty();
  const std::string out_root = in_place ? root : target_root;
  const auto start = std::chrono::steady_clock::now();
  UnpackReport report;
  const auto& samples = pack->manifest().samples;
  report.rows = static_cast<std::int64_t>(samples.size());
  for (const PackShard& s : pack->manifest().shards) report.bytes_before += s.bytes;
  threads = threads != 0 ? threads : std::thread::hardware_concurrency();
  threads = std::max(1U, threads);
  std::mutex mutex;
  std::atomic<std::size_t> next{0};
  run_workers(threads, [&](unsigned, const std::atomic<bool>& stop) {
    for (std::size_t i = next++; i < samples.size() && !stop; i = next++) {
      const PackEntry& e = samples[i];
      auto bytes = pack->file_bytes(e);
      if (!bytes.ok()) {
        std::lock_guard<std::mutex> lock(mutex);
        ++report.failed;
        if (report.examples.size() < max_examples) report.examples.push_back(bytes.error().what());
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
  if (in_place && report.failed == 0) {
    // Every per-sample file is durable: the manifest goes first (readers fall back to the files),
    // then the shards it named, then any shard file it did not name.
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
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace draftfeed
