#include "draftfeed/pipeline/cache_source.h"

#include <cstdio>
#include <cstring>

namespace draftfeed {

namespace {

std::string row_text(std::int64_t row) { return "row " + std::to_string(row); }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

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
  const TensorView& ids = sample.token_ids;
  const TensorView& hs = sample.hidden_states;
  const std::string where = row_text(global_row) + " (" + sample.path() + ")";
  if (ids.dtype != DType::kI64 || ids.shape.size() != 1) {
    return FetchOutcome::dropped(
        DropReason::kInvalid,
        where + ": token_ids must be int64 [T], got shape " + shape_text(ids.shape));
  }
  const std::int64_t tokens = ids.shape[0];
  bool equal = tokens == input_ids.size();
  for (std::int64_t t = 0; equal && t < tokens; ++t) {
    std::int64_t value;
    std::memcpy(&value, ids.data + t * 8, 8);  // safetensors data need not be aligned
    equal = value == input_ids[t];
  }
  if (!equal) {
    return FetchOutcome::dropped(DropReason::kMismatch,
                                 where + ": token ids do not match the dataset row (" +
                                     std::to_string(tokens) + " ids in the file, " +
                                     std::to_string(input_ids.size()) + " in the row)");
  }
  HiddenDType dtype;
  switch (hs.dtype) {
    case DType::kBF16:
      dtype = HiddenDType::kBF16;
      break;
    case DType::kF16:
      dtype = HiddenDType::kF16;
      break;
    case DType::kF32:
      dtype = HiddenDType::kF32;
      break;
    default:
      return FetchOutcome::dropped(DropReason::kInvalid,
                                   where + ": hidden_states dtype must be bf16, f16 or f32");
  }
  if (hs.shape.size() != 3 || hs.shape[0] != tokens || hs.shape[1] < 1) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 where + ": hidden_states must be [T, L, H] with T = " +
                                     std::to_string(tokens) + ", got " + shape_text(hs.shape));
  }
  FetchedSample fetched;
  fetched.owner = sample.file;
  fetched.hidden = HiddenStatesView{hs.data, dtype, hs.shape[0], hs.shape[1], hs.shape[2]};
  return FetchOutcome::ok(std::move(fetched));
}

}  // namespace draftfeed
