#include "draftfeed/common/error.h"

namespace draftfeed {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kNotFound:
      return "not found";
    case ErrorKind::kIo:
      return "I/O error";
    case ErrorKind::kFormat:
      return "format error";
    case ErrorKind::kMismatch:
      return "mismatch";
    case ErrorKind::kNonFinite:
      return "non-finite values";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kRuntime:
      return "runtime error";
  }
  return "unknown";
}

}  // namespace draftfeed
