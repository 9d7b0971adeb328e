// The offline sample source over a hidden-states transfer (hidden_states_transfer.h): each sample
// comes from `transfer.get_cached(row)`, and `on_missing` decides what a missing one means (raise:
// the drop is fatal; skip, warn: a plain drop). The Python bindings give it hs-connectors' transfer
// objects (a Mooncake transfer, a custom one) when no online source is asked for.
//
// Thread safety: as the transfer's get_cached (called from the pipeline's threads concurrently).
#pragma once

#include <cstdint>
#include <memory>

#include "draftfeed/source/cache_source.h"
#include "draftfeed/source/hidden_states_transfer.h"

namespace draftfeed {

class TransferSampleSource : public SampleSource {
 public:
  // `transfer` must not be null (kInvalidArgument).
  TransferSampleSource(std::shared_ptr<HiddenStatesTransfer> transfer, OnMissing on_missing);
  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;

 private:
  std::shared_ptr<HiddenStatesTransfer> transfer_;
  OnMissing on_missing_;
};

}  // namespace draftfeed
