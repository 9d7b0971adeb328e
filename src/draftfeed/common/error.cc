#include "draftfeed/common/error.h"

#include <cstring>

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

namespace {

// strerror_r comes in two flavours: GNU's returns the text (in the buffer or not), XSI's an int.
// Only one of these is called, depending on the C library.
[[maybe_unused]] const char* strerror_text(const char* gnu_result, const char* /*buffer*/) {
  return gnu_result;
}
[[maybe_unused]] const char* strerror_text(int xsi_result, const char* buffer) {
  return xsi_result == 0 ? buffer : "unknown error";
}

}  // namespace

std::string os_error_text(int err) {
  // Not std::generic_category().message(): libstdc++ 12 builds that with strerror.
  char buffer[256] = {};
  return strerror_text(::strerror_r(err, buffer, sizeof buffer), buffer);
}

}  // namespace draftfeed
