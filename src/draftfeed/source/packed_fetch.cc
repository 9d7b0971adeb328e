#include "draftfeed/source/packed_fetch.h"

#include "draftfeed/source/cache_source.h"

namespace draftfeed {

std::shared_ptr<const PackedCache> open_packed_cache(const std::string& hidden_states_path) {
  auto pack = PackedCache::open(hidden_states_path);
  if (!pack.ok()) throw pack.error();
  return pack.value();
}

namespace {

// Keeps a decoded sample's buffer and its shard alive together.
struct DecodedOwner {
  std::shared_ptr<const SafetensorsFile> shard;
  std::shared_ptr<const std::vector<std::uint8_t>> decoded;
};

}  // namespace

FetchOutcome fetch_packed(const PackedCache& pack, const PackEntry& entry,
                          const IntArrayView& input_ids, DType fp8_dequantize_dtype) {
  auto read = pack.read(entry);
  if (!read.ok()) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 "row " + std::to_string(entry.row) + ": " + read.error().what());
  }
  const PackedSample& packed = read.value();
  FetchOutcome outcome = CacheSampleSource::check(entry.row, input_ids, packed.sample,
                                                  fp8_dequantize_dtype, /*read_rows=*/false);
  if (outcome.sample && packed.decoded) {
    // Decoded memory, not the mapping: the copy reads it as memory a transfer gave.
    outcome.sample->owner =
        std::make_shared<const DecodedOwner>(DecodedOwner{packed.sample.file, packed.decoded});
    outcome.sample->file = nullptr;
  }
  if (!outcome.sample) outcome.message = pack.where(entry) + ": " + outcome.message;
  return outcome;
}

namespace {

struct FilteredRows {
  std::shared_ptr<const std::vector<PlannedBatch>> batches;
  std::vector<std::vector<std::int64_t>> rows;
};

}  // namespace

PrefetchPlan plan_without_packed(const PackedCache& pack,
                                 std::shared_ptr<const std::vector<PlannedBatch>> batches) {
  auto filtered = std::make_shared<FilteredRows>();
  filtered->rows.reserve(batches->size());
  for (const PlannedBatch& batch : *batches) {
    std::vector<std::int64_t>& rows = filtered->rows.emplace_back();
    for (const std::int64_t row : batch.rows) {
      if (pack.find(row) == nullptr) rows.push_back(row);
    }
  }
  filtered->batches = std::move(batches);
  PrefetchPlan plan;
  plan.batches.reserve(filtered->rows.size());
  for (const auto& rows : filtered->rows) plan.batches.emplace_back(rows);
  plan.owner = std::move(filtered);
  return plan;
}

}  // namespace draftfeed
