#include "draftfeed/batch/batch_spec.h"

#include <array>
#include <cmath>
#include <string>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

namespace {

constexpr std::array<EnumName<Preprocess>, 7> kPreprocessNames = {{
    {Preprocess::kNone, "none"},
    {Preprocess::kNone, ""},
    {Preprocess::kEagle3Shift, "eagle3"},
    {Preprocess::kEagle3Shift, "peagle"},
    {Preprocess::kEagle3Shift, "shift"},
    {Preprocess::kMtp, "mtp"},
    {Preprocess::kCustom, "custom"},
}};
constexpr std::array<EnumName<NoiseKind>, 4> kNoiseKindNames = {{
    {NoiseKind::kUniform, "uniform"},
    {NoiseKind::kGaussian, "gaussian"},
    {NoiseKind::kGaussian, "normal"},
    {NoiseKind::kNone, "none"},
}};

}  // namespace

Preprocess parse_preprocess(std::string_view text) {
  return parse_enum(text, kPreprocessNames, "preprocess");
}

const char* preprocess_name(Preprocess preprocess) {
  return enum_name(preprocess, kPreprocessNames);
}

NoiseKind parse_noise_kind(std::string_view text) {
  return parse_enum(text, kNoiseKindNames, "noise");
}

const char* noise_kind_name(NoiseKind kind) { return enum_name(kind, kNoiseKindNames); }

void BatchSpec::validate() const {
  require(max_len > 0, ErrorKind::kInvalidArgument,
          "total_seq_len must be positive, got " + std::to_string(max_len));
  require(hidden_size > 0, ErrorKind::kInvalidArgument,
          "hidden_size must be positive, got " + std::to_string(hidden_size));
  require(num_target_layers > 0, ErrorKind::kInvalidArgument,
          "num_target_layers must be positive, got " + std::to_string(num_target_layers));
  require(dtype == DType::kBF16 || dtype == DType::kF32, ErrorKind::kInvalidArgument,
          std::string("hidden_states_dtype must be bfloat16 or float32 for training, got ") +
              torch_dtype_name(dtype) +
              (dtype == DType::kF8E4M3 ? " (a file type, dequantized into the batch's)" : ""));
  require(std::isfinite(noise.std) && noise.std >= 0.0, ErrorKind::kInvalidArgument,
          "noise_std must be >= 0, got " + std::to_string(noise.std));
}

}  // namespace draftfeed
