// Which rows a loader will fetch, batch by batch: the plan the loader makes each epoch, the
// pipeline walks and a source reads ahead of.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace draftfeed {

// One batch of an epoch's plan: its position in the full plan (what resume records) and its samples
// as global dataset rows, in packing order.
struct PlannedBatch {
  std::int64_t index = 0;
  std::vector<std::int64_t> rows;
};

// What a loader will fetch, told to its source as each epoch starts, before its first fetch
// (SampleSource::will_need). The loader makes it (loader/loader.h): the plan is the epoch driver's,
// the source only reads ahead of it.
struct ReadAheadPlan {
  // The loader's own: loaders sharing a source (a training and a validation loader) each have one,
  // and a new plan replaces only that loader's.
  int stream = 0;
  // This epoch's batches still to deliver, in delivery order. The loader does not change them
  // until the epoch ends; the source may keep the pointer.
  std::shared_ptr<const std::vector<PlannedBatch>> batches;
  // The next epoch's batches, when the source asked for them (plans_next_epoch) and the loader
  // trains (a validation pass has training after it, and would hold what it fetched all that time).
  std::vector<PlannedBatch> next;
  // What the source's read-ahead may hold ahead of the loader (the loader's read_ahead_bytes, or
  // the default rule: read_ahead/byte_budget.h read_ahead_budget_bytes); 0: the source's own
  // default (a source driven without a loader).
  std::uint64_t budget_bytes = 0;
};

}  // namespace draftfeed
