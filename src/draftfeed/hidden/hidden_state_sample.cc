#include "draftfeed/hidden/hidden_state_sample.h"

#include <string>

namespace draftfeed {

Result<HiddenStateSample> HiddenStateSample::from_file(
    const std::shared_ptr<const SafetensorsFile>& file) {
  const TensorView* ids = file->find(kTokenIdsKey);
  const TensorView* states = file->find(kHiddenStatesKey);
  if (ids == nullptr || states == nullptr) {
    std::string present;
    for (const auto& view : file->tensors()) {
      present += (present.empty() ? "`" : ", `") + view.name + "`";
    }
    const std::string missing = ids == nullptr && states == nullptr
                                    ? std::string("`token_ids` and `hidden_states`")
                                : ids == nullptr ? std::string("`token_ids`")
                                                 : std::string("`hidden_states`");
    return Error(ErrorKind::kFormat, file->path() + ": no tensor " + missing + " (it holds " +
                                         (present.empty() ? std::string("none") : present) + ")");
  }
  const TensorView* scales = file->find(kHiddenStatesScalesKey);
  return HiddenStateSample{file, *ids, *states,
                           scales == nullptr ? std::nullopt : std::optional<TensorView>(*scales)};
}

}  // namespace draftfeed
