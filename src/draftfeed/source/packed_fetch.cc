#include "draftfeed/source/packed_fetch.h"

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed {

std::shared_ptr<LivePackedCache> open_packed_cache(const std::string& hidden_states_path) {
  return std::make_shared<LivePackedCache>(hidden_states_path);
}

bool drop_may_be_a_rewrite(const FetchOutcome& outcome) {
  return !outcome.sample &&
         (outcome.reason == DropReason::kMissing || outcome.reason == DropReason::kInvalid);
}

namespace {

// Keeps a decoded sample's buffer and its shard alive together.
struct DecodedOwner {
  std::shared_ptr<const void> shard;
  std::shared_ptr<const std::uint8_t[]> decoded;
};

}  // namespace

FetchOutcome fetch_packed(const PackedCache& pack, const PackEntry& entry,
                          const IntArrayView& input_ids, DType fp8_dequantize_dtype,
                          CompressedRead compressed) {
  auto read = pack.read(entry, /*always_check=*/false, compressed);
  if (!read.ok()) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 "row " + std::to_string(entry.row) + ": " + read.error().what());
  }
  const PackedSample& packed = read.value();
  const HiddenStateSample& sample = packed.sample;
  // As CacheSampleSource::check, less what a per-sample file needs: the shard stays mapped for all
  // its rows (no release of this process's pages), and the copy takes the rows from the mapping.
  const SampleCheck check = validate_sample(sample, input_ids, entry.row, ValueCheck::kSkip);
  if (!check.ok()) {
    const DropReason reason = check.problem == SampleProblem::kTokenMismatch ? DropReason::kMismatch
                                                                             : DropReason::kInvalid;
    return FetchOutcome::dropped(reason, pack.where(entry) + ": " + check.message);
  }
  const TensorView& hs = sample.hidden_states;
  FetchedSample fetched;
  fetched.hidden = HiddenStatesView{hs.data, hs.dtype, hs.shape[0], hs.shape[1], hs.shape[2]};
  if (hs.dtype == DType::kF8E4M3) {
    fetched.hidden.scales = sample.scales->data;  // validate_sample checked them
    fetched.hidden.dequantize = fp8_dequantize_dtype;
  }
  fetched.read_rows = false;
  if (packed.compressed) {
    // Decoded by the copy from the mapping: the file is there for the guard's message and the
    // change check.
    fetched.owner = sample.file;
    fetched.file = sample.file->mapping();
    fetched.compressed = packed.compressed;
  } else if (packed.decoded) {
    // Decoded memory, not the mapping: the copy reads it as memory a transfer gave.
    fetched.owner = std::make_shared<const DecodedOwner>(DecodedOwner{sample.file, packed.decoded});
  } else {
    fetched.owner = sample.file;
    fetched.file = sample.file->mapping();
  }
  return FetchOutcome::ok(std::move(fetched));
}

FetchOutcome decoded_whole(FetchOutcome outcome) {
  if (!outcome.sample || !outcome.sample->compressed) return outcome;
  FetchedSample& sample = *outcome.sample;
  const CompressedPlanes& planes = *sample.compressed;
  std::vector<std::uint8_t> blob(planes.planes.blob_bytes);
  if (!guarded_copy(blob.data(), planes.data, blob.size())) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 planes.where + ": the shard shrank while being read");
  }
  const HiddenStatesView& hs = sample.hidden;
  const std::size_t bytes =
      static_cast<std::size_t>(hs.tokens * hs.layers * hs.hidden) * dtype_size(hs.dtype);
  std::shared_ptr<std::uint8_t[]> decoded = std::make_shared_for_overwrite<std::uint8_t[]>(bytes);
  if (const auto error = plane_decode(hs.dtype, blob, {decoded.get(), bytes})) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 planes.where + ": hidden_states: " + error->what());
  }
  sample.hidden.data = decoded.get();
  sample.owner = std::make_shared<const DecodedOwner>(DecodedOwner{sample.owner, decoded});
  sample.file = nullptr;
  sample.compressed = nullptr;
  return outcome;
}

FileReadAhead::RangeOf packed_range_of(std::shared_ptr<const LivePackedCache> live) {
  return [live = std::move(live)](std::int64_t row) -> std::optional<FileRange> {
    const std::shared_ptr<const PackedCache> pack = live->current();
    const PackEntry* entry = pack != nullptr ? pack->find(row) : nullptr;
    if (entry == nullptr) return std::nullopt;  // a per-sample file
    auto shard = pack->shard(entry->shard);
    if (!shard.ok()) return FileRange{};  // its fetch reports why
    return FileRange{shard.value()->file->mapping(), entry->offset, entry->length};
  };
}

}  // namespace draftfeed
