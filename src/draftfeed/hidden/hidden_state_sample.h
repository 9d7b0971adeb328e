// One sample's cached hidden states: a checked safetensors file and its two tensors
// (docs/formats.md), plus, in hs-connectors' FP8 files, the per-token scales of F8_E4M3 hidden
// states.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/safetensors.h"

namespace draftfeed {

inline constexpr const char* kTokenIdsKey = "token_ids";
inline constexpr const char* kHiddenStatesKey = "hidden_states";
// hs-connectors' FP8HiddenStatesConnector: float32 [T, 1, 1], one scale per token.
inline constexpr const char* kHiddenStatesScalesKey = "hidden_states_scales";

struct HiddenStateSample {
  std::shared_ptr<const SafetensorsFile> file;  // keeps both views' bytes mapped
  TensorView token_ids;                         // normally I64 [T]
  TensorView hidden_states;                     // normally BF16 [T, L, H]
  std::optional<TensorView> scales;             // `hidden_states_scales`, when the file has it

  // Takes the two tensors (and the scales, if any) out of `file`. Only the two tensors' presence is
  // checked here (kFormat naming the file and the tensors it has); shapes, dtypes and values are
  // `validate_sample`'s job.
  static Result<HiddenStateSample> from_file(const std::shared_ptr<const SafetensorsFile>& file);

  const std::string& path() const { return file->path(); }
};

}  // namespace draftfeed
