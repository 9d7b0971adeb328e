#include "draftfeed/pipeline/cache_source.h"

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

CacheSampleSource::CacheSampleSource(std::shared_ptr<const CacheStore> store, OnMissing on_missing)
    : store_(std::move(store)), on_missing_(on_missing) {}

FetchOutcome CacheSampleSource::fetch(std::int64_t global_row, const IntArrayView& input_ids) {
  auto found = store_->lookup(global_row);
  if (!found.ok()) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 row_text(global_row) + ": " + found.error().what());
  }
  if (!found.value()) {
    const std::string message =
        row_text(global_row) + ": no cached hidden states at " + store_->path_for(global_row);
    if (on_missing_ == OnMissing::kRaise)
      return FetchOutcome::dropped(DropReason::kMissing, message, true);
    if (on_missing_ == OnMissing::kWarn)
      std::fprintf(stderr, "draftfeed: warning: %s\n", message.c_str());
    return FetchOutcome::dropped(DropReason::kMissing, message);
  }
  return check(global_row, input_ids, *found.value());
}

FetchOutcome CacheSampleSource::check(std::int64_t global_row, const IntArrayView& input_ids,
                                      const HiddenStateSample& sample) {
  // Values are checked for NaN/Inf later, inside the copy into the batch (one read of the bytes).
  const SampleCheck check = validate_sample(sample, input_ids, global_row, ValueCheck::kSkip);
  if (!check.ok()) {
    const DropReason reason = check.problem == SampleProblem::kTokenMismatch ? DropReason::kMismatch
                                                                             : DropReason::kInvalid;
    return FetchOutcome::dropped(reason, check.message);
  }
  const TensorView& hs = sample.hidden_states;
  const HiddenDType dtype = hs.dtype == DType::kBF16  ? HiddenDType::kBF16
                            : hs.dtype == DType::kF16 ? HiddenDType::kF16
                                                      : HiddenDType::kF32;
  FetchedSample fetched;
  fetched.owner = sample.file;
  fetched.file = sample.file->mapping();
  fetched.hidden = HiddenStatesView{hs.data, dtype, hs.shape[0], hs.shape[1], hs.shape[2]};
  return FetchOutcome::ok(std::move(fetched));
}

}  // namespace draftfeed
