#include "draftfeed/source/cache_source.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/file_system.h"
#include "draftfeed/common/fp8.h"
#include "draftfeed/hidden/validate.h"
#include "draftfeed/source/packed_fetch.h"

namespace draftfeed {

namespace {

std::string row_text(std::int64_t row) { return "row " + std::to_string(row); }

}  // namespace

namespace {

constexpr std::array<EnumName<OnMissing>, 4> kOnMissingNames = {{
    {OnMissing::kGenerate, "generate"},
    {OnMissing::kSkip, "skip"},
    {OnMissing::kWarn, "warn"},
    {OnMissing::kRaise, "raise"},
}};

constexpr std::array<EnumName<CacheCopy>, 3> kCacheCopyNames = {{
    {CacheCopy::kAuto, "auto"},
    {CacheCopy::kRead, "read"},
    {CacheCopy::kMap, "map"},
}};

}  // namespace

CacheCopy parse_cache_copy(std::string_view text) {
  return parse_enum(text, kCacheCopyNames, "cache copy (DRAFTFEED_CACHE_COPY)");
}

const char* cache_copy_name(CacheCopy copy) { return enum_name(copy, kCacheCopyNames); }

OnMissing parse_on_missing(std::string_view text) {
  return parse_enum(text, kOnMissingNames, "on_missing");
}

const char* on_missing_name(OnMissing on_missing) { return enum_name(on_missing, kOnMissingNames); }

void CacheSourceOptions::validate() const {
  store().validate();
  require(is_fp8_dequantize_dtype(fp8_dequantize_dtype), ErrorKind::kInvalidArgument,
          std::string("fp8_dequantize_dtype: FP8 values dequantize into bfloat16, float16 or "
                      "float32 (FP8Transfer's dequantize_dtype), got ") +
              torch_dtype_name(fp8_dequantize_dtype));
}

bool CacheSourceOptions::rows_are_read() const {
  CacheCopy chosen = copy;
  if (chosen == CacheCopy::kAuto) {
    const char* env = std::getenv("DRAFTFEED_CACHE_COPY");  // NOLINT(concurrency-mt-unsafe)
    if (env != nullptr && *env != '\0') chosen = parse_cache_copy(env);
  }
  return chosen == CacheCopy::kRead;  // kAuto maps (see CacheCopy)
}

CacheStoreOptions CacheSourceOptions::store() const {
  CacheStoreOptions store;
  store.root = hidden_states_path;
  store.lock_timeout = lock_timeout;
  store.lock_poll = lock_poll;
  return store;
}

namespace {

const CacheSourceOptions& checked(const CacheSourceOptions& options) {
  options.validate();
  require(options.on_missing != OnMissing::kGenerate, ErrorKind::kInvalidArgument,
          "on_missing='generate' needs the online source (draftfeed.online.OnlineSource, or "
          "--endpoint on the command line)");
  return options;
}

}  // namespace

CacheSampleSource::CacheSampleSource(const CacheSourceOptions& options)
    : CacheSampleSource(std::make_shared<const CacheStore>(checked(options).store()), options) {}

CacheSampleSource::CacheSampleSource(std::shared_ptr<const CacheStore> store,
                                     const CacheSourceOptions& options,
                                     FileReadAheadOptions read_ahead)
    : store_(std::move(store)),
      options_(checked(options)),
      read_rows_(options_.rows_are_read()),
      blocking_fetches_(on_network_file_system(options_.hidden_states_path) ? 8 : 0),
      pack_(open_packed_cache(options_.hidden_states_path)),
      read_ahead_(std::make_unique<FileReadAhead>(
          // Header only, descriptor kept: the read-ahead reads ahead through it (and the copy too
          // with CacheCopy kRead), never around the header's page when thousands of files are
          // opened ahead.
          [store = store_](std::int64_t row) { return store->lookup(row, kMapForRowReads); },
          read_ahead, packed_range_of(pack_))) {}

FetchOutcome CacheSampleSource::fetch(std::int64_t global_row, const IntArrayView& input_ids) {
  const std::shared_ptr<const PackedCache> pack = pack_->current();
  FetchOutcome outcome = fetch_once(pack.get(), global_row, input_ids);
  if (drop_may_be_a_rewrite(outcome)) {
    // A pack or unpack that finished during the epoch: the row is in the new pack, or back in its
    // file (one stat of the manifest to know).
    auto now = pack_->refresh();
    if (!now.ok()) return FetchOutcome::dropped(DropReason::kInvalid, now.error().what());
    if (now.value() != pack) outcome = fetch_once(now.value().get(), global_row, input_ids);
  }
  if (outcome.reason == DropReason::kMissing && !outcome.sample) {
    if (options_.on_missing == OnMissing::kRaise) outcome.fatal = true;
    if (options_.on_missing == OnMissing::kWarn) {
      std::fprintf(stderr, "draftfeed: warning: %s\n", outcome.message.c_str());
    }
  }
  return outcome;
}

FetchOutcome CacheSampleSource::fetch_once(const PackedCache* pack, std::int64_t global_row,
                                           const IntArrayView& input_ids) {
  // A packed sample that fails its checks gives way to a per-sample file of its row (one that
  // `draftfeed generate` wrote to repair it); without one, the pack's reason is the row's.
  std::optional<FetchOutcome> packed_drop;
  if (const PackEntry* entry = pack != nullptr ? pack->find(global_row) : nullptr) {
    // Its range's read ahead waited for, or done now when it was found and not yet read; its
    // bytes released from the read-ahead's budget.
    read_ahead_->take(global_row);
    FetchOutcome packed = fetch_packed(*pack, *entry, input_ids, options_.fp8_dequantize_dtype,
                                       CompressedRead::kInCopy);
    if (packed.sample) return packed;
    packed_drop = std::move(packed);
  }
  // Opened (and read) ahead, or, when the read-ahead has not got there, opened now and read whole
  // before the copy's preads (as the read-ahead would have: read_before_copy).
  std::optional<FileReadAhead::Prepared> prepared = read_ahead_->take(global_row);
  if (!prepared) {
    prepared.emplace(store_->lookup(global_row, kMapForRowReads));
    if (prepared->ok() && prepared->value()) read_before_copy(*prepared->value()->file->mapping());
  }
  FileReadAhead::Prepared found = std::move(*prepared);
  if (!found.ok()) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 row_text(global_row) + ": " + found.error().what());
  }
  if (!found.value()) {
    if (packed_drop) return std::move(*packed_drop);
    return FetchOutcome::dropped(
        DropReason::kMissing,
        row_text(global_row) + ": no cached hidden states at " + store_->paths_text(global_row));
  }
  return check(global_row, input_ids, *found.value(), options_.fp8_dequantize_dtype, read_rows_);
}

void CacheSampleSource::will_need(const ReadAheadPlan& plan) {
  // A rewrite that finished since the last epoch is seen now (one stat of the manifest).
  auto refreshed = pack_->refresh();
  if (!refreshed.ok()) throw refreshed.error();
  // Packed rows too: read ahead by their ranges in their shards (packed_range_of), no file looked
  // for.
  FileReadAheadPlan files;
  files.batches.reserve(plan.batches->size());
  for (const PlannedBatch& batch : *plan.batches) files.batches.emplace_back(batch.rows);
  files.owner = plan.batches;
  files.budget_bytes = plan.budget_bytes;
  read_ahead_->plan(std::move(files));
}

StatsTree CacheSampleSource::stats_report() const {
  StatsTree out;
  out.add_group("read_ahead", stats_tree(read_ahead_->stats()));
  return out;
}

void CacheSampleSource::interrupt() { read_ahead_->clear(); }

void CacheSampleSource::resume() { read_ahead_->clear(); }

FetchOutcome CacheSampleSource::check(std::int64_t global_row, const IntArrayView& input_ids,
                                      const HiddenStateSample& sample, DType fp8_dequantize_dtype,
                                      bool read_rows) {
  // Values are checked for NaN/Inf later, inside the copy into the batch (one read of the bytes).
  const SampleCheck check = validate_sample(sample, input_ids, global_row, ValueCheck::kSkip);
  if (!check.ok()) {
    const DropReason reason = check.problem == SampleProblem::kTokenMismatch ? DropReason::kMismatch
                                                                             : DropReason::kInvalid;
    return FetchOutcome::dropped(reason, check.message);
  }
  // validate_sample admits bf16, f16, f32 and F8_E4M3 hidden states only.
  const TensorView& hs = sample.hidden_states;
  const DType dtype = hs.dtype;
  FetchedSample fetched;
  fetched.owner = sample.file;
  fetched.file = sample.file->mapping();
  fetched.hidden = HiddenStatesView{hs.data, dtype, hs.shape[0], hs.shape[1], hs.shape[2]};
  if (dtype == DType::kF8E4M3) {
    // validate_sample checked the scales: F32 [T, 1, 1], finite and positive.
    fetched.hidden.scales = sample.scales->data;
    fetched.hidden.dequantize = fp8_dequantize_dtype;
  }
  // The pages the checks touched through the mapping (header, token ids, FP8 scales; on a file
  // system with large folios a fault maps a whole 2 MiB folio) leave this process's memory now:
  // the copy (batch/sample_copy.h) maps or reads the rows it needs.
  if (fetched.file->fd() >= 0) fetched.file->release(0, fetched.file->size());
  if (!read_rows) {
    // The mapped copy (CacheCopy): the copy takes the rows from the mapping, its pages in the page
    // cache already (read ahead, or read before the copy); should some have left it, a fault reads
    // around it again instead of page by page (header_only's MADV_RANDOM ends).
    fetched.read_rows = false;
    fetched.file->advise_normal();
  }
  return FetchOutcome::ok(std::move(fetched));
}

}  // namespace draftfeed
