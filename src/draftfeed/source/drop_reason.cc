#include "draftfeed/source/sample_source.h"

namespace draftfeed {

const char* drop_reason_name(DropReason reason) {
  switch (reason) {
    case DropReason::kMissing:
      return "missing";
    case DropReason::kMismatch:
      return "mismatched";
    case DropReason::kInvalid:
      return "invalid";
    case DropReason::kNonFinite:
      return "nonfinite";
    case DropReason::kGenerationFailed:
      return "generation_failed";
    case DropReason::kCount:
      break;
  }
  return "unknown";
}

}  // namespace draftfeed
