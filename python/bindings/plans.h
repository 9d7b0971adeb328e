// Plans between C++ and Python, shared by the planner's bindings (sampler.cc) and the loader's
// (engine.cc).
#pragma once

#include <nanobind/nanobind.h>

#include "draftfeed/sampler/multipack.h"
#include "sample_source.h"

namespace draftfeed::python {

namespace nb = nanobind;

// A 1-d integer array-like as contiguous int64 (copied only when it is not that already); errors
// name it as `what`.
Int64Input int64_array_of(nb::handle values, const char* what);

// One rank's batches as a list of int64 numpy arrays, views of one array that owns the plan.
nb::list batches_to_python(RankPlan&& plan);

// The order of ties in each batch's final window: "numpy" (numpy.argsort, as the reference),
// "native" (the planner's own: an empty WindowOrder) or a callable with argsort's contract. The
// result borrows `order` (and `numpy_argsort`, which it may set): both must outlive the planning.
WindowOrder window_order_of(nb::handle order, nb::object& numpy_argsort);

}  // namespace draftfeed::python
