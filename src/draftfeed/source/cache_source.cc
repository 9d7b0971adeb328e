#include "draftfeed/source/cache_source.h"

#include <cstdio>
#include <cstring>

#include "draftfeed/hidden/validate.h"

namespace draftfeed {

namespace {

std::string row_text(std::int64_t row) { return "row " + std::to_string(row); }

}  // namespace

OnMissing parse_on_missing(const std::string& text) {
  if (text == "skip") return OnMissing::kSkip;
  if (text == "warn") return OnMissing::kWarn;
  if (text == "raise") return OnMissing::kRaise;
  throw Error(ErrorKind::kInvalidArgument,
              "on_missing must be one of 'generate', 'skip', 'warn', 'raise', got '" + text + "'");
}

DType parse_fp8_dequantize(const std::string& text) {
  const std::string name = text.rfind("torch.", 0) == 0 ? text.substr(6) : text;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  if (name == "float32") return DType::kF32;
  throw Error(ErrorKind::kInvalidArgument,
              "FP8 values dequantize into bfloat16, float16 or float32 (FP8Transfer's "
              "dequantize_dtype), got '" +
                  text + "'");
}

CacheSampleSource::CacheSampleSource(std::shared_ptr<const CacheStore> store, OnMissing on_missing,
                                     DType fp8_dequantize, CachePrefetchOptions prefetch)
    : store_(std::move(store)),
      on_missing_(on_missing),
      fp8_dequantize_(fp8_dequantize),
      prefetch_(std::make_unique<CachePrefetch>(
          // Header only: its bytes are read through the descriptor (cache_prefetch.h), not around
          // the header's page when thousands of files are opened ahead.
          [store = store_](std::int64_t row) { return store->lookup(row, /*header_only=*/true); },
          prefetch)) {
  require(fp8_dequantize != DType::kF8E4M3, ErrorKind::kInvalidArgument,
          "FP8 values dequantize into bfloat16, float16 or float32, not float8_e4m3fn");
}

FetchOutcome CacheSampleSource::fetch(std::int64_t global_row, const IntArrayView& input_ids) {
  // Opened (and read) ahead, or, when the prefetch has not got there, opened now.
  std::optional<CachePrefetch::Prepared> prepared = prefetch_->take(global_row);
  if (!prepared) {
    prepared.emplace(store_->lookup(global_row));
    // Read ahead of the copy, sequentially, as the prefetch would have.
    if (prepared->ok() && prepared->value()) read_before_copy(*prepared->value()->file->mapping());
  }
  CachePrefetch::Prepared found = std::move(*prepared);
  if (!found.ok()) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 row_text(global_row) + ": " + found.error().what());
  }
  if (!found.value()) {
    const std::string message =
        row_text(global_row) + ": no cached hidden states at " + store_->paths_text(global_row);
    if (on_missing_ == OnMissing::kRaise)
      return FetchOutcome::dropped(DropReason::kMissing, message, true);
    if (on_missing_ == OnMissing::kWarn)
      std::fprintf(stderr, "draftfeed: warning: %s\n", message.c_str());
    return FetchOutcome::dropped(DropReason::kMissing, message);
  }
  return check(global_row, input_ids, *found.value(), fp8_dequantize_);
}

void CacheSampleSource::will_need(std::shared_ptr<const std::vector<PlannedBatch>> batches) {
  PrefetchPlan plan;
  plan.batches.reserve(batches->size());
  for (const PlannedBatch& batch : *batches) plan.batches.emplace_back(batch.rows);
  plan.owner = std::move(batches);
  prefetch_->plan(std::move(plan));
}

void CacheSampleSource::interrupt() { prefetch_->clear(); }

void CacheSampleSource::resume() { prefetch_->clear(); }

FetchOutcome CacheSampleSource::check(std::int64_t global_row, const IntArrayView& input_ids,
                                      const HiddenStateSample& sample, DType fp8_dequantize) {
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
    fetched.hidden.dequantize = fp8_dequantize;
  }
  return FetchOutcome::ok(std::move(fetched));
}

}  // namespace draftfeed
