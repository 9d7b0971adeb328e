// A Python transfer object (hs-connectors interface, see python_transfer.h) as the offline sample
// source (source/transfer_source.h): each sample comes from `transfer.get_cached(file_idx)`.
// Slower than the native store: every sample takes the GIL.
#include "draftfeed/source/transfer_source.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "draftfeed/source/cache_source.h"
#include "python_transfer.h"
#include "sample_source.h"

namespace draftfeed::python {

void init_transfer_source(nb::module_& m) {
  m.def(
      "python_transfer_source",
      [](nb::object transfer, const std::string& on_missing) {
        return PySampleSource{std::make_shared<TransferSampleSource>(
                                  make_python_transfer(std::move(transfer), /*generating=*/false),
                                  parse_on_missing(on_missing)),
                              "python transfer"};
      },
      nb::arg("transfer"), nb::arg("on_missing") = "skip",
      "A SampleSource calling transfer.get_cached(file_idx) (hs-connectors interface) per sample.");
}

}  // namespace draftfeed::python
