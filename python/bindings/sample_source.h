// A sample source made by one binding area (the online source, a Python transfer) and handed to
// `Loader(..., source=...)` by Python code: the loader's sources are pluggable without the loader
// binding knowing them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <string>

#include "draftfeed/source/packed_fetch.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed::python {

namespace nb = nanobind;

struct PySampleSource {
  std::shared_ptr<SampleSource> source;
  std::string description;
};

using Int64Input = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// One row through `source` with the GIL released (the per-sample paths and tests): the outcome, and
// `out` filled with {ok, reason, message, fatal}. Hidden states a pack left compressed for the
// batch copy are decoded whole here: the callers read `hidden.data`.
inline FetchOutcome fetch_one(SampleSource& source, std::int64_t row, const Int64Input& ids,
                              nb::dict& out) {
  const IntArrayView view{reinterpret_cast<const std::uint8_t*>(ids.data()),
                          static_cast<std::int64_t>(ids.shape(0)), 8, true};
  FetchOutcome outcome;
  {
    nb::gil_scoped_release release;
    outcome = decoded_whole(source.fetch(row, view));
  }
  out["ok"] = outcome.sample.has_value();
  out["reason"] = outcome.sample ? "ok" : drop_reason_name(outcome.reason);
  out["message"] = outcome.message;
  out["fatal"] = outcome.fatal;
  return outcome;
}

}  // namespace draftfeed::python
