#include "draftfeed/batch/batch_spec.h"

#include <cmath>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

Preprocess parse_preprocess(std::string_view text) {
  if (text == "none" || text.empty()) return Preprocess::kNone;
  if (text == "eagle3" || text == "peagle" || text == "shift") return Preprocess::kEagle3Shift;
  if (text == "mtp") return Preprocess::kMtp;
  if (text == "custom") return Preprocess::kCustom;
  throw Error(ErrorKind::kInvalidArgument,
              "preprocess must be 'none', 'eagle3', 'peagle', 'mtp' or 'custom', got '" +
                  std::string(text) + "'");
}

const char* preprocess_name(Preprocess preprocess) {
  switch (preprocess) {
    case Preprocess::kNone:
      return "none";
    case Preprocess::kEagle3Shift:
      return "eagle3";
    case Preprocess::kMtp:
      return "mtp";
    case Preprocess::kCustom:
      return "custom";
  }
  return "none";
}

NoiseKind parse_noise_kind(std::string_view text) {
  if (text == "uniform") return NoiseKind::kUniform;
  if (text == "gaussian" || text == "normal") return NoiseKind::kGaussian;
  if (text == "none") return NoiseKind::kNone;
  throw Error(ErrorKind::kInvalidArgument,
              "noise must be 'uniform', 'gaussian' or 'none', got '" + std::string(text) + "'");
}

const char* noise_kind_name(NoiseKind kind) {
  switch (kind) {
    case NoiseKind::kUniform:
      return "uniform";
    case NoiseKind::kGaussian:
      return "gaussian";
    case NoiseKind::kNone:
      break;
  }
  return "none";
}

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
