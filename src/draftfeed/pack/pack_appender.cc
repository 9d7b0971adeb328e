#include "draftfeed/pack/pack_appender.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <unordered_set>

#include "draftfeed/common/folder_lock.h"
#include "draftfeed/common/printable.h"
#include "draftfeed/common/xxh64.h"
#include "draftfeed/pack/durable_file.h"
#include "draftfeed/pack/pack_manifest.h"

namespace draftfeed {

namespace {

// What a manifest line of one sample costs, about (the budget counts the manifest's bytes too).
constexpr std::uint64_t kManifestBytesPerSample = 128;
constexpr std::size_t kMaxMessages = 64;

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

// The pack's bytes on disk: its shards as the manifest says them, and the manifest.
std::uint64_t pack_bytes(const std::string& root, const PackManifest& manifest) {
  std::uint64_t bytes = file_size(root + "/" + kPackManifestName);
  for (const PackShard& shard : manifest.shards) bytes += shard.bytes;
  return bytes;
}

PackManifest read_manifest(const std::string& root) {
  auto manifest = read_pack_manifest(root);
  if (!manifest.ok()) throw manifest.error();
  return manifest.value() ? std::move(*manifest.value()) : PackManifest{};
}

}  // namespace

void PackAppendOptions::validate() const {
  require(!root.empty(), ErrorKind::kInvalidArgument, "the cache folder (root) is needed");
  require(shard_bytes >= 1 && shard_bytes <= (std::uint64_t{1} << 40), ErrorKind::kInvalidArgument,
          "cache_shard_bytes must be between 1 and 2^40, got " + std::to_string(shard_bytes));
  require(lock_wait.count() >= 0 && lock_wait.count() <= 3600, ErrorKind::kInvalidArgument,
          "the commit's lock wait must be between 0 and 3600 seconds, got " +
              std::to_string(lock_wait.count()));
  require(codec.zstd_level >= -7 && codec.zstd_level <= 19, ErrorKind::kInvalidArgument,
          "the zstd level must be between -7 and 19, got " + std::to_string(codec.zstd_level));
}

PackAppender::PackAppender(PackAppendOptions options) : options_(std::move(options)) {
  options_.validate();
  const PackManifest manifest = read_manifest(options_.root);
  stats_.budget_bytes = options_.budget_bytes;
  stats_.pack_bytes = pack_bytes(options_.root, manifest);
  stats_.full = options_.budget_bytes > 0 && stats_.pack_bytes >= options_.budget_bytes;
  thread_ = std::thread([this] { run(); });
}

PackAppender::~PackAppender() {
  flush();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool PackAppender::offer(std::int64_t row, std::shared_ptr<const SafetensorsFile> file) {
  const std::uint64_t bytes = file->file_size();
  {
    std::lock_guard lock(mutex_);
    ++stats_.offered;
    if (stats_.full) {
      ++stats_.refused_full;
      return false;
    }
    // One sample is always taken when none waits, however large.
    if (!queue_.empty() && stats_.queued_bytes + bytes > options_.queue_bytes) {
      ++stats_.refused_queue;
      return false;
    }
    stats_.queued_bytes += bytes;
    queue_.push_back(Offer{row, std::move(file), bytes});
  }
  wake_.notify_all();
  return true;
}

void PackAppender::flush() {
  std::unique_lock lock(mutex_);
  const std::uint64_t ticket = ++flush_asked_;
  wake_.notify_all();
  done_.wait(lock, [&] { return flush_done_ >= ticket; });
}

void PackAppender::flush_async() {
  {
    std::lock_guard lock(mutex_);
    ++flush_asked_;
  }
  wake_.notify_all();
}

bool PackAppender::full() const {
  std::lock_guard lock(mutex_);
  return stats_.full;
}

PackAppendStats PackAppender::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::vector<std::string> PackAppender::take_messages() {
  std::lock_guard lock(mutex_);
  return std::exchange(messages_, {});
}

void PackAppender::note(std::string message) {
  std::lock_guard lock(mutex_);
  if (messages_.size() < kMaxMessages) messages_.push_back(std::move(message));
}

void PackAppender::run() {
  std::vector<EncodedSample> shard;
  std::uint64_t shard_bytes = 0;
  while (true) {
    std::optional<Offer> next;
    std::uint64_t flush_ticket = 0;
    std::uint64_t seen_pack_bytes = 0;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || flush_asked_ > flush_done_; });
      if (!queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
      } else if (flush_asked_ > flush_done_) {
        flush_ticket = flush_asked_;
      } else {
        return;  // stopping, and nothing left
      }
      seen_pack_bytes = stats_.pack_bytes;
    }
    if (next) {
      std::optional<EncodedSample> encoded;
      try {
        encoded = encode_pack_sample(next->row, *next->file, options_.compress, options_.codec);
      } catch (const Error& error) {
        note("row " + std::to_string(next->row) + ": not kept: " + error.what());
      }
      // Its bytes in the shard: its parts, and its names in the shard's header.
      const EncodedSample* alone = encoded ? &*encoded : nullptr;
      const std::uint64_t size =
          encoded ? encoded->bytes.size() + pack_shard_header({&alone, 1}, "").size() : 0;
      const bool fits =
          options_.budget_bytes == 0 ||
          seen_pack_bytes + shard_bytes + size + (shard.size() + 1) * kManifestBytesPerSample <=
              options_.budget_bytes;
      {
        std::lock_guard lock(mutex_);
        stats_.queued_bytes -= next->bytes;
        if (!encoded) ++stats_.failed;
        if (encoded && !fits) {
          // This one would go past the budget: the pack is as full as it gets (rows beyond it
          // are generated every epoch).
          ++stats_.dropped_budget;
          stats_.full = true;
        }
      }
      next.reset();  // the file's mapping goes now
      if (encoded && fits) {
        shard_bytes += size;
        shard.push_back(std::move(*encoded));
      }
      if (shard_bytes >= options_.shard_bytes || (!fits && !shard.empty())) {
        shard_bytes = 0;
        commit(std::exchange(shard, {}));
      }
      continue;
    }
    shard_bytes = 0;
    if (!shard.empty()) commit(std::exchange(shard, {}));
    {
      std::lock_guard lock(mutex_);
      flush_done_ = flush_ticket;
    }
    done_.notify_all();
  }
}

namespace {

// A shard of `samples` as a file's pieces (size field, header, samples) and their entries (offsets
// from the file's start); `header` and `size_field` hold what the pieces point at.
struct ShardFile {
  std::string header;
  std::uint8_t size_field[8] = {};
  std::vector<std::span<const std::uint8_t>> pieces;
  std::vector<PackEntry> entries;
  std::uint64_t bytes = 0;
};

void lay_out(ShardFile& file, std::span<const EncodedSample> samples, const std::string& codec) {
  std::vector<const EncodedSample*> order;
  order.reserve(samples.size());
  for (const EncodedSample& s : samples) order.push_back(&s);
  file.header = pack_shard_header(order, codec);
  const std::uint64_t header_size = file.header.size();
  std::memcpy(file.size_field, &header_size, 8);
  file.pieces.clear();
  file.entries.clear();
  file.pieces.emplace_back(file.size_field, 8);
  file.pieces.emplace_back(reinterpret_cast<const std::uint8_t*>(file.header.data()),
                           file.header.size());
  std::uint64_t at = 8 + header_size;
  for (const EncodedSample& s : samples) {
    file.pieces.emplace_back(s.bytes.data(), s.bytes.size());
    PackEntry e;
    e.row = s.row;
    e.offset = at;
    e.length = s.bytes.size();
    e.checksum = xxh64(s.bytes);
    e.file_bytes = s.file_bytes;
    file.entries.push_back(e);
    at += s.bytes.size();
  }
  file.bytes = at;
}

}  // namespace

void PackAppender::commit(std::vector<EncodedSample> samples) {
  const std::string& root = options_.root;
  const std::string codec = options_.compress ? kPlaneCodecName : "none";
  const std::string name_hint = root + "/" + pack_shard_name(0);
  const auto count_of = [](std::size_t n) { return static_cast<std::int64_t>(n); };
  const auto dropped = [&](std::int64_t PackAppendStats::*counter, std::int64_t n,
                           std::string why) {
    std::lock_guard lock(mutex_);
    stats_.*counter += n;
    if (!why.empty() && messages_.size() < kMaxMessages) messages_.push_back(std::move(why));
  };
  // The shard as a file, durable before any lock is taken: the commit then only renames it.
  ShardFile file;
  lay_out(file, samples, codec);
  std::string temporary;
  try {
    temporary = write_temporary_durably(name_hint, file.pieces);
  } catch (const Error& error) {
    dropped(&PackAppendStats::failed, count_of(samples.size()),
            std::string("a shard of generated rows not kept: ") + error.what());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  auto lock =
      FolderLock::acquire(root, options_.what, options_.lock_wait, std::chrono::milliseconds(20));
  if (!lock.ok()) {
    ::unlink(temporary.c_str());
    dropped(&PackAppendStats::dropped_lock, count_of(samples.size()),
            std::to_string(samples.size()) +
                " generated rows not kept (their shard dropped): " + lock.error().what());
    return;
  }
  try {
    remove_dead_temporaries(root);
    PackManifest manifest = read_manifest(root);
    const std::uint64_t used = pack_bytes(root, manifest);
    std::unordered_set<std::int64_t> have;
    for (const PackEntry& e : manifest.samples) have.insert(e.row);
    const auto new_rows = [&](const std::vector<PackEntry>& entries) {
      std::uint64_t n = 0;
      for (const PackEntry& e : entries) n += have.contains(e.row) ? 0 : 1;
      return n;
    };
    const auto over = [&] {
      return options_.budget_bytes > 0 &&
             used + file.bytes + new_rows(file.entries) * kManifestBytesPerSample >
                 options_.budget_bytes;
    };
    std::size_t keep = samples.size();
    if (over()) {
      // Others kept rows since this shard was assembled: as many of its samples as still fit, in a
      // shard written again (rare: at the budget's edge only).
      while (keep > 0 && over()) lay_out(file, std::span(samples).first(--keep), codec);
      ::unlink(temporary.c_str());
      temporary.clear();
      {
        std::lock_guard guard(mutex_);
        stats_.dropped_budget += count_of(samples.size() - keep);
        stats_.full = true;
        stats_.pack_bytes = used;
      }
      if (keep == 0) return;
      temporary = write_temporary_durably(name_hint, file.pieces);
    }
    std::vector<PackEntry> added;
    for (const PackEntry& e : file.entries) {
      if (!have.contains(e.row)) added.push_back(e);
    }
    if (added.empty()) {
      ::unlink(temporary.c_str());
      std::lock_guard guard(mutex_);
      stats_.duplicates += count_of(keep);
      stats_.pack_bytes = used;
      return;
    }
    const auto index = static_cast<std::uint32_t>(manifest.shards.size());
    rename_durably(temporary, root + "/" + pack_shard_name(index));
    temporary.clear();
    manifest.shards.push_back(PackShard{pack_shard_name(index), file.bytes});
    for (PackEntry& e : added) {
      e.shard = index;
      manifest.samples.push_back(e);
    }
    if (options_.compress) manifest.codec = kPlaneCodecName;
    if (options_.budget_bytes > 0) manifest.budget_bytes = options_.budget_bytes;
    write_pack_manifest(root, manifest);
    const std::uint64_t now = pack_bytes(root, manifest);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard guard(mutex_);
    stats_.kept += count_of(added.size());
    stats_.duplicates += count_of(keep - added.size());
    ++stats_.shards;
    stats_.kept_bytes += file.bytes;
    stats_.pack_bytes = now;
    stats_.commit_seconds += seconds;
    if (options_.budget_bytes > 0 && now >= options_.budget_bytes) stats_.full = true;
  } catch (const Error& error) {
    if (!temporary.empty()) ::unlink(temporary.c_str());
    dropped(&PackAppendStats::failed, count_of(samples.size()),
            std::string("a shard of generated rows not kept: ") + error.what());
  }
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  const auto refuse = [&] {
    return Error(ErrorKind::kInvalidArgument,
                 what + " must be a size such as 500GB, 1.5TB, 64MiB or a byte count, got '" +
                     printable(text) + "'");
  };
  std::size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    throw refuse();
  }
  if (!std::isfinite(value) || value < 0 || text.empty() || !std::isdigit(text[0])) throw refuse();
  std::string unit = text.substr(end);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  static constexpr const char* kUnits = "kMGTP";
  double scale = 1;
  if (!unit.empty()) {
    const bool binary = unit.size() == 2 && unit[1] == 'i';
    if (unit.size() != 1 && !binary) throw refuse();
    const char prefix = unit[0] == 'K' ? 'k' : unit[0];
    const char* at = std::strchr(kUnits, prefix);
    if (at == nullptr || prefix == '\0') throw refuse();
    scale = std::pow(binary ? 1024.0 : 1000.0, static_cast<double>(at - kUnits + 1));
  }
  const double bytes = value * scale;
  if (bytes > 9.0e18) throw refuse();
  return static_cast<std::uint64_t>(std::llround(bytes));
}

}  // namespace draftfeed
