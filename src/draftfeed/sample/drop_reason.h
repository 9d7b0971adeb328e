// Why a sample did not make it into its batch: the reasons the pipeline counts drops by and the
// names the reports give them.
#pragma once

#include <cstdint>

namespace draftfeed {

// Why a sample was dropped from its batch. Counted per reason by the pipeline.
enum class DropReason : std::uint8_t {
  kMissing,           // no cached file (on_missing = skip or warn)
  kMismatch,          // the file's token ids differ from the row's
  kInvalid,           // unreadable, corrupt, or wrong shape/dtype
  kNonFinite,         // NaN or Inf in the hidden states (found while copying)
  kGenerationFailed,  // online generation exhausted its attempts
  kCount,
};
const char* drop_reason_name(DropReason reason);

}  // namespace draftfeed
