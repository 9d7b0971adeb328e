#include "draftfeed/sample/drop_reason.h"

#include <array>

#include "draftfeed/common/enum_names.h"

namespace draftfeed {

constexpr std::array<EnumName<DropReason>, 5> kDropReasonNames = {{
    {DropReason::kMissing, "missing"},
    {DropReason::kMismatch, "mismatched"},
    {DropReason::kInvalid, "invalid"},
    {DropReason::kNonFinite, "nonfinite"},
    {DropReason::kGenerationFailed, "generation_failed"},
}};
static_assert(kDropReasonNames.size() == static_cast<std::size_t>(DropReason::kCount) &&
              names_each_value_in_order(kDropReasonNames));

const char* drop_reason_name(DropReason reason) { return enum_name(reason, kDropReasonNames); }

}  // namespace draftfeed
