#include "draftfeed/common/error.h"

#include <array>
#include <cstring>

#include "draftfeed/common/enum_names.h"

namespace draftfeed {

constexpr std::array<EnumName<ErrorKind>, 9> kErrorKindNames = {{
    {ErrorKind::kInvalidArgument, "invalid argument"},
    {ErrorKind::kNotFound, "not found"},
    {ErrorKind::kIo, "I/O error"},
    {ErrorKind::kFormat, "format error"},
    {ErrorKind::kMismatch, "mismatch"},
    {ErrorKind::kNonFinite, "non-finite values"},
    {ErrorKind::kTimeout, "timeout"},
    {ErrorKind::kUnsupported, "unsupported"},
    {ErrorKind::kRuntime, "runtime error"},
}};
static_assert(kErrorKindNames.size() == static_cast<std::size_t>(ErrorKind::kRuntime) + 1 &&
              names_each_value_in_order(kErrorKindNames));

const char* error_kind_name(ErrorKind kind) { return enum_name(kind, kErrorKindNames); }

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
