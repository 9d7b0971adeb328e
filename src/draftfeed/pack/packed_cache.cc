#include "draftfeed/pack/packed_cache.h"

#include <sys/stat.h>

#include <cstring>

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/xxh64.h"

namespace draftfeed {

PackedCache::PackedCache(std::string root, PackManifest manifest, FileStamp stamp)
    : root_(std::move(root)),
      manifest_(std::move(manifest)),
      stamp_(stamp),
      checked_(std::make_unique<std::atomic<bool>[]>(manifest_.samples.size())),
      shards_(manifest_.shards.size()) {
  rows_.reserve(manifest_.samples.size());
  for (std::size_t i = 0; i < manifest_.samples.size(); ++i) rows_[manifest_.samples[i].row] = i;
}

Result<std::shared_ptr<const PackedCache>> PackedCache::open(const std::string& root,
                                                             const PackedCache* previous) {
  FileStamp stamp;
  auto manifest = read_pack_manifest(root, &stamp);
  if (!manifest.ok()) return manifest.error();
  if (!manifest.value()) return std::shared_ptr<const PackedCache>();
  std::shared_ptr<PackedCache> pack(new PackedCache(root, std::move(*manifest.value()), stamp));
  if (previous != nullptr) pack->adopt(*previous);
  return std::shared_ptr<const PackedCache>(std::move(pack));
}

std::shared_ptr<const PackedCache> PackedCache::of_manifest(const std::string& root,
                                                            PackManifest manifest) {
  return std::shared_ptr<const PackedCache>(new PackedCache(root, std::move(manifest), {}));
}

namespace {

// Whether the file at `path` is still the one `file` opened (device and inode).
bool still_the_file(const std::string& path, const MappedFile& file) {
  struct stat here {};
  struct stat held {};
  return file.fd() >= 0 && ::lstat(path.c_str(), &here) == 0 && ::fstat(file.fd(), &held) == 0 &&
         here.st_dev == held.st_dev && here.st_ino == held.st_ino && here.st_size == held.st_size;
}

}  // namespace

void PackedCache::adopt(const PackedCache& previous) {
  std::unordered_map<std::string, std::size_t> shard_by_name;
  for (std::size_t i = 0; i < manifest_.shards.size(); ++i)
    shard_by_name[manifest_.shards[i].file] = i;
  std::vector<bool> lent(manifest_.shards.size(), false);
  {
    std::lock_guard<std::mutex> lock(previous.mutex_);
    for (std::size_t i = 0; i < previous.shards_.size(); ++i) {
      const auto& opened = previous.shards_[i];
      if (!opened || !opened->ok()) continue;
      const PackShard& info = previous.manifest_.shards[i];
      const auto it = shard_by_name.find(info.file);
      if (it == shard_by_name.end() || manifest_.shards[it->second].bytes != info.bytes) continue;
      if (!still_the_file(root_ + "/" + info.file, *opened->value()->file->mapping())) continue;
      shards_[it->second] = opened;
      lent[it->second] = true;
    }
  }
  // Samples checked by the previous pack, in a shard lent, at the same range with the same
  // checksum, are the same bytes: not hashed again.
  for (std::size_t i = 0; i < manifest_.samples.size(); ++i) {
    const PackEntry& e = manifest_.samples[i];
    if (!lent[e.shard]) continue;
    const PackEntry* old = previous.find(e.row);
    if (old == nullptr) continue;
    const auto old_index = static_cast<std::size_t>(old - previous.manifest_.samples.data());
    if (previous.manifest_.shards[old->shard].file == manifest_.shards[e.shard].file &&
        old->offset == e.offset && old->length == e.length && old->checksum == e.checksum &&
        old->file_bytes == e.file_bytes &&
        previous.checked_[old_index].load(std::memory_order_relaxed)) {
      checked_[i].store(true, std::memory_order_relaxed);
    }
  }
}

const PackEntry* PackedCache::find(std::int64_t row) const {
  const auto it = rows_.find(row);
  return it == rows_.end() ? nullptr : &manifest_.samples[it->second];
}

std::string PackedCache::where(const PackEntry& entry) const {
  return root_ + "/" + manifest_.shards[entry.shard].file + ", offset " +
         std::to_string(entry.offset) + ", row " + std::to_string(entry.row);
}

Result<std::shared_ptr<const OpenPackShard>> PackedCache::shard(std::uint32_t index) const {
  if (index >= shards_.size()) {
    return Error(ErrorKind::kInvalidArgument, "no shard " + std::to_string(index));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (shards_[index]) return *shards_[index];
  const PackShard& info = manifest_.shards[index];
  const std::string path = root_ + "/" + info.file;
  auto opened = [&]() -> Result<std::shared_ptr<const OpenPackShard>> {
    // The descriptor kept: the batch copy asks the open file whether it changed (no path lookup,
    // and on a network file system no round trip), once per sample, and the read-ahead reads the
    // samples' ranges through it. The header's pages are read alone (kMapForRowReads), not with
    // the kernel's read-around: that would read megabytes of samples no plan asked for yet, and
    // mark them so that the first read of one of them reads the next window too.
    auto file = SafetensorsFile::open(path, kMapForRowReads);
    if (!file.ok()) return file.error();
    const auto& shard_file = file.value();
    if (shard_file->file_size() != info.bytes) {
      return Error(ErrorKind::kFormat, path + ": " + std::to_string(shard_file->file_size()) +
                                           " bytes, the manifest says " +
                                           std::to_string(info.bytes) + " (truncated or replaced)");
    }
    auto index_result = index_pack_shard(shard_file->tensors(), shard_file->metadata(), path);
    if (!index_result.ok()) return index_result.error();
    // The samples' pages read around again when touched (a reader that does not read ahead).
    shard_file->mapping()->advise_normal();
    auto open_shard = std::make_shared<OpenPackShard>();
    open_shard->file = shard_file;
    open_shard->index = std::move(index_result).value();
    return std::shared_ptr<const OpenPackShard>(std::move(open_shard));
  }();
  shards_[index] =
      std::make_shared<const Result<std::shared_ptr<const OpenPackShard>>>(std::move(opened));
  return *shards_[index];
}

Result<const PackedSampleParts*> PackedCache::parts(const PackEntry& entry,
                                                    const OpenPackShard& shard) const {
  const auto it = shard.index.find(entry.row);
  if (it == shard.index.end()) {
    return Error(ErrorKind::kFormat, where(entry) + ": the shard holds no tensors of the row");
  }
  const PackedSampleParts& parts = it->second;
  if (!parts.problem.empty()) return Error(ErrorKind::kFormat, where(entry) + ": " + parts.problem);
  if (parts.begin != entry.offset || parts.end != entry.offset + entry.length) {
    return Error(ErrorKind::kFormat, where(entry) + ": the row's tensors span bytes " +
                                         std::to_string(parts.begin) + ".." +
                                         std::to_string(parts.end) + ", the manifest says " +
                                         std::to_string(entry.offset) + ".." +
                                         std::to_string(entry.offset + entry.length));
  }
  return &parts;
}

namespace {

// XXH64 of the mapped bytes, read under a fault guard (a shard truncated meanwhile is an error,
// not a SIGBUS).
Result<std::uint64_t> guarded_hash(const std::uint8_t* data, std::size_t size,
                                   const std::string& where) {
  std::uint64_t hash = 0;
  const bool ok = guard_mapped_reads([&] { hash = xxh64({data, size}); });
  if (!ok) return Error(ErrorKind::kIo, where + ": the shard shrank while being read");
  return hash;
}

// The blob's header and chunk table, copied out of the mapping under the guard and parsed.
Result<PlaneBlob> parse_mapped_blob(const PackedPart& hidden, const std::string& where) {
  const std::string shrank = where + ": the shard shrank while being read";
  std::vector<std::uint8_t> head(std::min<std::size_t>(hidden.view.nbytes, 32));
  if (!guarded_copy(head.data(), hidden.view.data, head.size())) {
    return Error(ErrorKind::kIo, shrank);
  }
  const std::size_t head_bytes = std::min(plane_head_bytes(head), hidden.view.nbytes);
  if (head_bytes > head.size()) {
    head.resize(head_bytes);
    if (!guarded_copy(head.data(), hidden.view.data, head.size())) {
      return Error(ErrorKind::kIo, shrank);
    }
  }
  auto parsed = plane_parse(hidden.dtype, head, hidden.view.nbytes,
                            hidden.decoded_bytes / dtype_size(hidden.dtype));
  if (!parsed.ok()) {
    return Error(ErrorKind::kFormat, where + ": hidden_states: " + parsed.error().what());
  }
  return parsed;
}

}  // namespace

Result<PackedSample> PackedCache::read(const PackEntry& entry, bool always_check,
                                       CompressedRead compressed) const {
  auto open_shard = shard(entry.shard);
  if (!open_shard.ok()) {
    return Error(open_shard.error().kind(), where(entry) + ": " + open_shard.error().what());
  }
  const OpenPackShard& s = *open_shard.value();
  auto found = parts(entry, s);
  if (!found.ok()) return found.error();
  const PackedSampleParts& p = *found.value();
  const std::uint8_t* begin = s.file->mapping()->data() + entry.offset;
  // The entry's "checked once" flag, when it is one of the manifest's entries (a copy is always
  // checked).
  const auto index = static_cast<std::size_t>(&entry - manifest_.samples.data());
  const bool own = &entry >= manifest_.samples.data() && index < manifest_.samples.size();
  std::atomic<bool>* checked = own ? &checked_[index] : nullptr;
  const bool check =
      always_check || checked == nullptr || !checked->load(std::memory_order_relaxed);
  if (check) {
    auto hash = guarded_hash(begin, entry.length, where(entry));
    if (!hash.ok()) return hash.error();
    if (hash.value() != entry.checksum) {
      return Error(ErrorKind::kFormat, where(entry) + ": the sample's bytes hash to " +
                                           xxh64_hex(hash.value()) + ", the manifest says " +
                                           xxh64_hex(entry.checksum) + " (corrupt)");
    }
    // The parts as the shard's header says them, against the sample's own header (checksummed).
    std::vector<std::uint8_t> header(p.header.nbytes);
    if (!guarded_copy(header.data(), p.header.data, header.size())) {
      return Error(ErrorKind::kIo, where(entry) + ": the shard shrank while being read");
    }
    if (auto error = check_parts_against_header(p, header, entry.file_bytes, where(entry))) {
      return std::move(*error);
    }
    if (checked != nullptr) checked->store(true, std::memory_order_relaxed);
  }
  PackedSample out;
  out.sample.file = s.file;
  const TensorView* ids = nullptr;
  const TensorView* scales = nullptr;
  const PackedPart* hidden = nullptr;
  for (const PackedPart& part : p.parts) {
    if (part.name == kTokenIdsKey) ids = &part.view;
    if (part.name == kHiddenStatesScalesKey) scales = &part.view;
    if (part.name == kHiddenStatesKey) hidden = &part;
    if (part.compressed && part.name != kHiddenStatesKey) {
      return Error(ErrorKind::kFormat, where(entry) + ": part " + part.name +
                                           " is compressed (only hidden_states may be)");
    }
  }
  if (ids == nullptr || hidden == nullptr) {
    return Error(ErrorKind::kFormat, where(entry) + ": no token_ids or hidden_states part");
  }
  out.sample.token_ids = *ids;
  out.sample.token_ids.name = kTokenIdsKey;
  if (scales != nullptr) {
    out.sample.scales = *scales;
    out.sample.scales->name = kHiddenStatesScalesKey;
  }
  if (!hidden->compressed) {
    out.sample.hidden_states = hidden->view;
  } else if (compressed == CompressedRead::kInCopy && !check) {
    auto planes = parse_mapped_blob(*hidden, where(entry));
    if (!planes.ok()) return planes.error();
    TensorView view;
    view.dtype = hidden->dtype;
    view.shape = hidden->shape;
    view.nbytes = hidden->decoded_bytes;
    out.sample.hidden_states = std::move(view);
    out.compressed = std::make_shared<const CompressedPlanes>(
        CompressedPlanes{hidden->view.data, std::move(planes).value(), where(entry)});
  } else {
    // The blob is copied out of the mapping under the guard, then decoded (the decoder allocates,
    // which a guarded function must not).
    std::vector<std::uint8_t> blob(hidden->view.nbytes);
    if (!guarded_copy(blob.data(), hidden->view.data, blob.size())) {
      return Error(ErrorKind::kIo, where(entry) + ": the shard shrank while being read");
    }
    // Its pages leave this process's memory (the page cache keeps them): the copy reads the
    // decoded bytes, and nothing else releases them (else an epoch of first reads would leave the
    // whole pack mapped).
    s.file->mapping()->release(hidden->view.data, hidden->view.data + hidden->view.nbytes);
    std::shared_ptr<std::uint8_t[]> decoded =
        std::make_shared_for_overwrite<std::uint8_t[]>(hidden->decoded_bytes);
    // The blob's own hash of the decoded bytes is checked with the sample's checksum.
    const std::optional<Error> error = plane_decode(
        hidden->dtype, blob, std::span<std::uint8_t>(decoded.get(), hidden->decoded_bytes), check);
    if (error) return Error(ErrorKind::kFormat, where(entry) + ": hidden_states: " + error->what());
    TensorView view;
    view.dtype = hidden->dtype;
    view.shape = hidden->shape;
    view.data = decoded.get();
    view.nbytes = hidden->decoded_bytes;
    out.sample.hidden_states = std::move(view);
    out.decoded = std::move(decoded);
  }
  out.sample.hidden_states.name = kHiddenStatesKey;
  return out;
}

Result<std::vector<std::uint8_t>> PackedCache::file_bytes(const PackEntry& entry) const {
  auto sample = read(entry, /*always_check=*/true);
  if (!sample.ok()) return sample.error();
  const OpenPackShard& s = *shard(entry.shard).value();
  const PackedSampleParts& p = *parts(entry, s).value();
  std::vector<std::uint8_t> out;
  out.reserve(entry.file_bytes);
  bool whole = true;
  const auto append = [&](const std::uint8_t* data, std::size_t n) {
    const std::size_t at = out.size();
    out.resize(at + n);
    whole = guarded_copy(out.data() + at, data, n) && whole;
  };
  append(p.header.data, p.header.nbytes);
  for (const PackedPart& part : p.parts) {
    if (part.compressed) {
      append(sample.value().sample.hidden_states.data, sample.value().sample.hidden_states.nbytes);
    } else {
      append(part.view.data, part.view.nbytes);
    }
  }
  if (!whole) return Error(ErrorKind::kIo, where(entry) + ": the shard shrank while being read");
  if (out.size() != entry.file_bytes) {
    return Error(ErrorKind::kFormat, where(entry) + ": the parts make " +
                                         std::to_string(out.size()) + " bytes, the manifest says " +
                                         std::to_string(entry.file_bytes));
  }
  return out;
}

}  // namespace draftfeed
