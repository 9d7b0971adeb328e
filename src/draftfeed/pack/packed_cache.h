// Reading a packed cache (docs/formats.md, "Packed caches"): the manifest once, each shard mapped
// and indexed on first use and kept (one open per shard per process), a row's sample served from
// its shard's mapping after its checksum is checked. Compressed hidden states are either decoded
// whole into memory of their own, or, for a reader that decodes them itself (the batch copy,
// batch/compressed_rows_copy.h), handed over compressed: the blob's place in the mapping and its
// parsed chunk table.
//
// Every failure names the shard, the sample's offset and the row: a shard that does not open or
// whose size differs from the manifest's (truncated), a row whose tensors do not lie where the
// manifest says, a checksum that differs, a blob that does not decode. A shard that failed once is
// not opened again: its rows fail at once with the same message.
// Thread safety: const methods may be called from any number of threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/hidden_state_sample.h"
#include "draftfeed/pack/pack_manifest.h"
#include "draftfeed/pack/plane_codec.h"
#include "draftfeed/pack/shard_layout.h"

namespace draftfeed {

// A shard mapped and indexed.
struct OpenPackShard {
  std::shared_ptr<const SafetensorsFile> file;
  std::unordered_map<std::int64_t, PackedSampleParts> index;
};

// A row's sample from a pack.
struct PackedSample {
  HiddenStateSample sample;  // `file` is the shard; views into it or into `decoded`
  // The decoded hidden states when they were stored compressed (`sample.hidden_states` points in
  // here), else null.
  std::shared_ptr<const std::uint8_t[]> decoded;
  // The hidden states left compressed (read's kInCopy): `sample.hidden_states` has their dtype,
  // shape and decoded size, and no data. Else null.
  std::shared_ptr<const CompressedPlanes> compressed;
};

// How read() gives compressed hidden states: decoded whole, or left compressed for the reader
// (when the sample's checksum was checked before; a first read decodes whole, which also checks
// the blob's hash of its decoded bytes).
enum class CompressedRead : std::uint8_t { kWhole, kInCopy };

class PackedCache {
 public:
  // The pack in `root`: null when `root` has no manifest.json; an error when the manifest is bad
  // or unreadable. `previous`, a reader's earlier PackedCache of the same folder (the pack before
  // a rewrite), lends its open shards to this one where the file at the shard's name is still the
  // one it opened (device and inode), and its checked samples where shard, range and checksum are
  // the same: following a rewrite costs an open per new shard, not per shard.
  static Result<std::shared_ptr<const PackedCache>> open(const std::string& root,
                                                         const PackedCache* previous = nullptr);
  // A pack of `manifest` in `root` (a writer's, just written: pack_writer.h checks its samples
  // through one before it removes their per-sample files).
  static std::shared_ptr<const PackedCache> of_manifest(const std::string& root,
                                                        PackManifest manifest);

  const std::string& root() const { return root_; }
  const PackManifest& manifest() const { return manifest_; }
  // The manifest file this pack was read from (pack_manifest.h), to tell a rewrite since.
  const FileStamp& stamp() const { return stamp_; }
  // The manifest's entry of `row`, or null.
  const PackEntry* find(std::int64_t row) const;

  // "shard-000003.safetensors, offset 4096, row 17": where a sample is, for messages.
  std::string where(const PackEntry& entry) const;

  // The entry's shard, opened and indexed once.
  Result<std::shared_ptr<const OpenPackShard>> shard(std::uint32_t index) const;

  // The entry's sample, its compressed parts decoded. Its checksum is checked on its first read by
  // this PackedCache (every read with `always_check`), and with it each part's dtype, shape and
  // size (as the shard's header says them) against the sample's own header, which the checksum
  // covers (shard_layout.h's check_parts_against_header), before anything is allocated for it: a
  // loader reads every sample once an epoch, and a second pass over every byte each time would
  // cost a warm epoch a third of its speed. The batch copy still checks every value's finiteness
  // on every read.
  // Token ids and shapes are not checked against a dataset row here (validate.h).
  Result<PackedSample> read(const PackEntry& entry, bool always_check = false,
                            CompressedRead compressed = CompressedRead::kWhole) const;

  // The per-sample file the entry was packed from, byte for byte (checksum checked, parts
  // decoded).
  Result<std::vector<std::uint8_t>> file_bytes(const PackEntry& entry) const;

 private:
  PackedCache(std::string root, PackManifest manifest, FileStamp stamp);
  // What `previous` opened and checked that this pack names too (see open).
  void adopt(const PackedCache& previous);
  // The entry's parts, checked to lie exactly at the manifest's range.
  Result<const PackedSampleParts*> parts(const PackEntry& entry, const OpenPackShard& shard) const;

  std::string root_;
  PackManifest manifest_;
  FileStamp stamp_;
  std::unordered_map<std::int64_t, std::size_t> rows_;  // row -> index in manifest_.samples
  // Per sample: its checksum matched once (read's first check).
  std::unique_ptr<std::atomic<bool>[]> checked_;
  mutable std::mutex mutex_;  // guards shards_
  mutable std::vector<std::shared_ptr<const Result<std::shared_ptr<const OpenPackShard>>>> shards_;
};

}  // namespace draftfeed
