#include "draftfeed/hidden/validate.h"

#include <cstdio>
#include <cstring>
#include <limits>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/int_load.h"

namespace draftfeed {

namespace {

// Element `i` of a little-endian integer array of `width` bytes, unaligned.
std::int64_t load_integer(const std::uint8_t* data, std::int64_t i, unsigned width,
                          bool is_signed) {
  return load_int(data + i * static_cast<std::int64_t>(width), static_cast<std::uint8_t>(width),
                  is_signed);
}

std::string where(const HiddenStateSample& sample, std::int64_t row) {
  return sample.path() + (row >= 0 ? " (row " + std::to_string(row) + ")" : std::string()) + ": ";
}

SampleCheck fail(SampleProblem problem, std::string message) {
  SampleCheck check;
  check.problem = problem;
  check.message = std::move(message);
  return check;
}

SampleCheck shrank(const HiddenStateSample& sample, std::int64_t row, const char* what) {
  return fail(SampleProblem::kUnreadable,
              where(sample, row) + "the file shrank while its " + what +
                  " were read (truncated by another process: SIGBUS on the mapping)");
}

std::string slots_text(const std::vector<std::int64_t>& slots) {
  std::string text;
  for (const auto s : slots) text += (text.empty() ? "" : ", ") + std::to_string(s);
  return text;
}

}  // namespace

constexpr std::array<EnumName<SampleProblem>, 10> kSampleProblemNames = {{
    {SampleProblem::kNone, "ok"},
    {SampleProblem::kMissingKey, "missing key"},
    {SampleProblem::kBadTokenIds, "bad token_ids"},
    {SampleProblem::kTokenMismatch, "token mismatch"},
    {SampleProblem::kBadDtype, "bad dtype"},
    {SampleProblem::kBadShape, "bad shape"},
    {SampleProblem::kLengthMismatch, "length mismatch"},
    {SampleProblem::kBadScales, "bad scales"},
    {SampleProblem::kNonFinite, "non-finite"},
    {SampleProblem::kUnreadable, "unreadable"},
}};
static_assert(kSampleProblemNames.size() ==
                  static_cast<std::size_t>(SampleProblem::kUnreadable) + 1 &&
              names_each_value_in_order(kSampleProblemNames));

const char* sample_problem_name(SampleProblem problem) {
  return enum_name(problem, kSampleProblemNames);
}

ErrorKind SampleCheck::error_kind() const {
  switch (problem) {
    case SampleProblem::kTokenMismatch:
    case SampleProblem::kLengthMismatch:
      return ErrorKind::kMismatch;
    case SampleProblem::kNonFinite:
      return ErrorKind::kNonFinite;
    case SampleProblem::kBadDtype:
      return ErrorKind::kUnsupported;
    case SampleProblem::kUnreadable:
      return ErrorKind::kIo;
    default:
      return ErrorKind::kFormat;
  }
}

std::int64_t RowIds::operator[](std::int64_t i) const {
  return load_integer(data_, i, width_, signed_);
}

std::int64_t RowIds::first_difference(const TensorView& ids) const {
  const unsigned width = dtype_size(ids.dtype);
  const bool is_signed = dtype_is_signed_integer(ids.dtype);
  // Both sides int64: compare bytes, then find the index only if they differ.
  if (width == 8 && width_ == 8 && is_signed == signed_ &&
      std::memcmp(ids.data, data_, static_cast<std::size_t>(length_) * 8) == 0) {
    return -1;
  }
  for (std::int64_t i = 0; i < length_; ++i) {
    if (load_integer(ids.data, i, width, is_signed) != (*this)[i]) return i;
  }
  return -1;
}

std::string fp8_scales_problem(DType states, std::int64_t tokens, const TensorView* scales) {
  const std::string key = kHiddenStatesScalesKey;
  if (states != DType::kF8E4M3) {
    if (scales == nullptr) return "";
    return key + " is only used with F8_E4M3 hidden states, but hidden_states is " +
           std::string(dtype_name(states)) + " (is the file half converted?)";
  }
  if (scales == nullptr) {
    return "hidden_states is F8_E4M3 but there is no " + key +
           " (hs-connectors' FP8 files hold one float32 scale per token)";
  }
  const std::vector<std::int64_t> expected = {tokens, 1, 1};
  if (scales->dtype != DType::kF32 || scales->shape != expected) {
    return key + " is " + std::string(dtype_name(scales->dtype)) + " " +
           shape_to_string(scales->shape) + ", expected F32 " + shape_to_string(expected) +
           " (one scale per token)";
  }
  // Every scale finite and positive: a zero, negative or NaN scale cannot come from a quantizer
  // and would turn the token's values into zeros, sign flips or NaN.
  std::int64_t bad = 0;
  std::int64_t first_bad = -1;
  float first_value = 0.0f;
  const bool read = guard_mapped_reads([&] {
    for (std::int64_t t = 0; t < tokens; ++t) {
      float value;
      std::memcpy(&value, scales->data + t * 4, 4);
      if (value > 0.0f && value <= std::numeric_limits<float>::max()) continue;
      if (bad++ == 0) {
        first_bad = t;
        first_value = value;
      }
    }
  });
  if (!read) {
    return key +
           ": the file shrank while its scales were read (truncated or rewritten by another "
           "process)";
  }
  if (bad == 0) return "";
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", static_cast<double>(first_value));
  return key + " has " + std::to_string(bad) + " of " + std::to_string(tokens) +
         " scales that are not finite and positive (first: token " + std::to_string(first_bad) +
         ", " + shown + ")";
}

SampleCheck validate_sample(const HiddenStateSample& sample, const RowIds& ids, std::int64_t row,
                            ValueCheck values) {
  const TensorView& tokens = sample.token_ids;
  if (!dtype_is_integer(tokens.dtype) || tokens.shape.size() != 1) {
    return fail(SampleProblem::kBadTokenIds,
                where(sample, row) + "token_ids is " + std::string(dtype_name(tokens.dtype)) + " " +
                    shape_to_string(tokens.shape) + ", expected a 1-D integer tensor");
  }
  if (tokens.shape[0] != ids.size()) {
    return fail(SampleProblem::kTokenMismatch,
                where(sample, row) + "token_ids has " + std::to_string(tokens.shape[0]) +
                    " ids but the row has " + std::to_string(ids.size()));
  }
  std::int64_t at = -1;
  std::int64_t file_id = 0;
  std::int64_t row_id = 0;
  const bool read = guard_mapped_reads([&] {
    at = ids.first_difference(tokens);
    if (at >= 0) {
      file_id = load_integer(tokens.data, at, dtype_size(tokens.dtype),
                             dtype_is_signed_integer(tokens.dtype));
      row_id = ids[at];
    }
  });
  if (!read) {
    // Two mappings were read: the file's token ids and the row's (a dataset shard's).
    const IntArrayView row_ids = ids.view();
    if (row_ids.holds(last_guarded_fault_address())) {
      return fail(SampleProblem::kUnreadable, unreadable_row(row_ids, row, "input_ids").what());
    }
    return shrank(sample, row, "token ids");
  }
  if (at >= 0) {
    return fail(SampleProblem::kTokenMismatch,
                where(sample, row) + "token_ids differ from the row's input_ids at position " +
                    std::to_string(at) + " of " + std::to_string(ids.size()) + ": file has " +
                    std::to_string(file_id) + ", row has " + std::to_string(row_id));
  }

  const TensorView& states = sample.hidden_states;
  if (states.dtype != DType::kBF16 && states.dtype != DType::kF16 && states.dtype != DType::kF32 &&
      states.dtype != DType::kF8E4M3) {
    return fail(SampleProblem::kBadDtype,
                where(sample, row) + "hidden_states is " + std::string(dtype_name(states.dtype)) +
                    ", expected BF16, F16, F32 or F8_E4M3 (with hidden_states_scales)");
  }
  if (states.shape.size() != 3) {
    return fail(SampleProblem::kBadShape, where(sample, row) + "hidden_states has shape " +
                                              shape_to_string(states.shape) +
                                              ", expected 3-D [tokens, layers, hidden]");
  }
  if (states.shape[0] != ids.size()) {
    return fail(SampleProblem::kLengthMismatch,
                where(sample, row) + "hidden_states has " + std::to_string(states.shape[0]) +
                    " positions but the row has " + std::to_string(ids.size()) + " tokens");
  }

  const std::string scales_problem =
      fp8_scales_problem(states.dtype, states.shape[0], sample.scales ? &*sample.scales : nullptr);
  if (!scales_problem.empty()) {
    return fail(SampleProblem::kBadScales, where(sample, row) + scales_problem);
  }

  if (values == ValueCheck::kSkip) return SampleCheck{};
  const std::size_t count = states.nbytes / (dtype_size(states.dtype));
  bool finite = true;
  if (!guard_mapped_reads([&] { finite = all_finite(states.data, count, states.dtype); })) {
    return shrank(sample, row, "hidden states");
  }
  if (finite) return SampleCheck{};

  SampleCheck check;
  check.problem = SampleProblem::kNonFinite;
  check.per_layer.resize(static_cast<std::size_t>(states.shape[1]));
  const std::span<NonFiniteCounts> per_layer(check.per_layer);
  if (!guard_mapped_reads([&] {
        count_nonfinite_per_slot(states.data, states.shape[0], states.shape[1], states.shape[2],
                                 states.dtype, per_layer);
      })) {
    return shrank(sample, row, "hidden states");
  }
  for (std::size_t l = 0; l < check.per_layer.size(); ++l) {
    check.nan_count += check.per_layer[l].nan;
    check.inf_count += check.per_layer[l].inf;
    if (check.per_layer[l].total() > 0)
      check.nonfinite_layers.push_back(static_cast<std::int64_t>(l));
  }
  check.message = where(sample, row) + "hidden_states has " + std::to_string(check.nan_count) +
                  " NaN and " + std::to_string(check.inf_count) + " Inf values in layer slot" +
                  (check.nonfinite_layers.size() == 1 ? " " : "s ") +
                  slots_text(check.nonfinite_layers) + " (of " + std::to_string(states.shape[1]) +
                  ")";
  return check;
}

SampleCheck validate_file(const std::shared_ptr<const SafetensorsFile>& file, const RowIds& ids,
                          std::int64_t row, HiddenStateSample* sample) {
  auto taken = HiddenStateSample::from_file(file);
  if (!taken.ok()) {
    const std::string message = taken.error().what();
    return fail(SampleProblem::kMissingKey,
                row >= 0 ? message + " (row " + std::to_string(row) + ")" : message);
  }
  SampleCheck check = validate_sample(taken.value(), ids, row);
  if (sample != nullptr) *sample = std::move(taken).value();
  return check;
}

}  // namespace draftfeed
