// The offline sample source for a Python transfer object (hs-connectors interface, see
// python_transfer.h): each sample comes from `transfer.get_cached(file_idx)`, and `on_missing`
// decides what a missing one means. Slower than the native store: every sample takes the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "draftfeed/pipeline/cache_source.h"
#include "python_transfer.h"
#include "sample_source.h"

namespace draftfeed::python {
namespace {

class PythonTransferSource : public SampleSource {
 public:
  PythonTransferSource(std::shared_ptr<HiddenStatesTransfer> transfer, OnMissing on_missing)
      : transfer_(std::move(transfer)), on_missing_(on_missing) {}

  FetchOutcome fetch(std::int64_t row, const IntArrayView& input_ids) override {
    FetchOutcome outcome = transfer_->get_cached(row, input_ids);
    if (!outcome.sample && outcome.reason == DropReason::kMissing &&
        on_missing_ == OnMissing::kRaise) {
      outcome.fatal = true;
    }
    return outcome;
  }

 private:
  std::shared_ptr<HiddenStatesTransfer> transfer_;
  OnMissing on_missing_;
};

}  // namespace

void init_transfer_source(nb::module_& m) {
  m.def(
      "python_transfer_source",
      [](nb::object transfer, const std::string& on_missing) {
        return PySampleSource{std::make_shared<PythonTransferSource>(
                                  make_python_transfer(std::move(transfer), /*generating=*/false),
                                  parse_on_missing(on_missing)),
                              "python transfer"};
      },
      nb::arg("transfer"), nb::arg("on_missing") = "skip",
      "A SampleSource calling transfer.get_cached(file_idx) (hs-connectors interface) per sample.");
}

}  // namespace draftfeed::python
