// Checking one sample's hidden states against its dataset row (docs/formats.md, "Hidden-state
// files"), with a structured outcome so the engine can drop and count by reason.
//
// Checks, in order (the first failure is reported):
//   1. `token_ids` is a 1-D integer tensor (any width: the reference compares values, so an I32
//      file is as good as an I64 one) with the row's length and values;
//   2. `hidden_states` is BF16, F16, F32 or F8_E4M3 and 3-D [T, L, H] with T equal to the row's
//      length;
//   3. F8_E4M3 hidden states (hs-connectors' FP8 files) come with `hidden_states_scales`, F32
//      [T, 1, 1], every scale finite and positive; other dtypes have no scales;
//   4. every hidden-state value is finite (for FP8: no NaN code; a scale too large for the
//      dequantize dtype shows when the batch copy dequantizes). The scan is a vectorised bit test
//      at memory bandwidth; only when it finds something are NaN and Inf counted per layer slot.
// The mapped bytes are read under a fault guard (common/fault_guard.h): a file truncated by
// another process while it is checked is kUnreadable, not a SIGBUS.
// A file without one of the two keys fails earlier, in HiddenStateSample::from_file (kFormat);
// `validate_file` folds that case in as kMissingKey.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/error.h"
#include "draftfeed/common/finite.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/hidden_state_sample.h"

namespace draftfeed {

enum class SampleProblem {
  kNone,
  kMissingKey,      // no `token_ids` or no `hidden_states` (kFormat)
  kBadTokenIds,     // token_ids not a 1-D integer tensor (kFormat)
  kTokenMismatch,   // token_ids differ from the row's ids, in length or value (kMismatch)
  kBadDtype,        // hidden_states not BF16/F16/F32/F8_E4M3 (kUnsupported)
  kBadShape,        // hidden_states not 3-D (kFormat)
  kLengthMismatch,  // hidden_states.shape[0] != the row's length (kMismatch)
  kBadScales,       // FP8 scales missing, of the wrong dtype or shape, not finite and positive,
                    // or present beside hidden states that are not FP8 (kFormat)
  kNonFinite,       // NaN or Inf in hidden_states (kNonFinite)
  kUnreadable,      // the file shrank while being read: SIGBUS on its mapping (kIo)
};

// "ok", "missing key", "bad token_ids", "token mismatch", "bad dtype", "bad shape",
// "length mismatch", "bad scales", "non-finite", "unreadable".
const char* sample_problem_name(SampleProblem problem);

struct SampleCheck {
  SampleProblem problem = SampleProblem::kNone;
  std::string message;  // names the file, the row (when given) and the numbers that disagree
  // For kNonFinite: totals, and the counts per layer slot (L entries) and which slots have any.
  std::int64_t nan_count = 0;
  std::int64_t inf_count = 0;
  std::vector<NonFiniteCounts> per_layer;
  std::vector<std::int64_t> nonfinite_layers;

  bool ok() const { return problem == SampleProblem::kNone; }
  ErrorKind error_kind() const;
  Error to_error() const { return Error(error_kind(), message); }
};

// The row's token ids, whatever their storage: int64 values or a dataset's IntArrayView.
class RowIds {
 public:
  RowIds(std::span<const std::int64_t> ids)  // NOLINT(google-explicit-constructor)
      : data_(reinterpret_cast<const std::uint8_t*>(ids.data())),
        length_(static_cast<std::int64_t>(ids.size())) {}
  RowIds(const IntArrayView& ids)  // NOLINT(google-explicit-constructor)
      : data_(ids.data),
        length_(ids.length),
        width_(ids.byte_width),
        signed_(ids.is_signed),
        shard_(ids.shard) {}

  std::int64_t size() const { return length_; }
  // A dataset's ids lie in its mapped shard: read them under a fault guard (IntArrayView).
  std::int64_t operator[](std::int64_t i) const;
  // The first index where `ids` (a token_ids tensor's elements) differs, or -1 when equal.
  // `ids` must have size() elements.
  std::int64_t first_difference(const TensorView& ids) const;
  // The ids as a view (for unreadable_row and holds).
  IntArrayView view() const { return {data_, length_, width_, signed_, shard_}; }

 private:
  const std::uint8_t* data_;
  std::int64_t length_;
  std::uint8_t width_ = 8;
  bool signed_ = true;
  const std::string* shard_ = nullptr;
};

// Validates `sample` against the row. `row` (>= 0) is named in messages; pass -1 when unknown.
// Whether validate_sample scans every value for NaN/Inf. The engine skips it (kSkip) because its
// copy into the batch checks each value as it goes, so the bytes are read once.
enum class ValueCheck { kFinite, kSkip };

// Check 3 alone, for hidden states of dtype `states` with `tokens` rows: "" when the scales are
// right, else what is wrong with them (the file is not named). `scales` null: the file has none.
std::string fp8_scales_problem(DType states, std::int64_t tokens, const TensorView* scales);

SampleCheck validate_sample(const HiddenStateSample& sample, const RowIds& ids,
                            std::int64_t row = -1, ValueCheck values = ValueCheck::kFinite);

// Same, starting from a file: a missing key becomes kMissingKey. Fills `sample` when the keys
// exist.
SampleCheck validate_file(const std::shared_ptr<const SafetensorsFile>& file, const RowIds& ids,
                          std::int64_t row = -1, HiddenStateSample* sample = nullptr);

}  // namespace draftfeed
