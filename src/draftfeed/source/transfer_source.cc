#include "draftfeed/source/transfer_source.h"

#include <utility>

#include "draftfeed/common/error.h"

namespace draftfeed {

TransferSampleSource::TransferSampleSource(std::shared_ptr<HiddenStatesTransfer> transfer,
                                           OnMissing on_missing)
    : transfer_(std::move(transfer)), on_missing_(on_missing) {
  require(transfer_ != nullptr, ErrorKind::kInvalidArgument,
          "the transfer sample source needs a transfer");
}

FetchOutcome TransferSampleSource::fetch(std::int64_t row, const IntArrayView& input_ids) {
  FetchOutcome outcome = transfer_->get_cached(row, input_ids);
  if (!outcome.sample && outcome.reason == DropReason::kMissing &&
      on_missing_ == OnMissing::kRaise) {
    outcome.fatal = true;
  }
  return outcome;
}

}  // namespace draftfeed
