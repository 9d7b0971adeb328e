// One sample's cached hidden states: a checked safetensors file and its two tensors (SPEC §1.2).
#pragma once

#include <cstdint>
#include <memory>

#include "draftfeed/common/error.h"
#include "draftfeed/hidden/safetensors.h"

namespace draftfeed {

inline constexpr const char* kTokenIdsKey = "token_ids";
inline constexpr const char* kHiddenStatesKey = "hidden_states";

struct HiddenStateSample {
  std::shared_ptr<const SafetensorsFile> file;  // keeps both views' bytes mapped
  TensorView token_ids;                         // normally I64 [T]
  TensorView hidden_states;                     // normally BF16 [T, L, H]

  // Takes the two tensors out of `file`. Only their presence is checked here (kFormat naming the
  // file and the tensors it has); shapes, dtypes and values are `validate_sample`'s job.
  static Result<HiddenStateSample> from_file(const std::shared_ptr<const SafetensorsFile>& file);

  const std::string& path() const { return file->path(); }
};

}  // namespace draftfeed
