// Transfers the online source may be given from Python: the native Mooncake transfer
// (mooncake.cc), used as it is, or any object with hs-connectors' interface, called back per
// sample (python_transfer.h).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "draftfeed/source/hidden_states_transfer.h"
#include "draftfeed/source/mooncake_transfer.h"

namespace draftfeed::python {

namespace nb = nanobind;

// `_core.MooncakeTransfer`.
struct PyMooncakeTransfer {
  std::shared_ptr<MooncakeTransfer> transfer;
  std::string description;  // the store it connects to
};

// A `_core.MooncakeTransfer` as it is; any other object through make_python_transfer (generating:
// kInvalidArgument when it lacks get_cached, get_generated or delete).
std::shared_ptr<HiddenStatesTransfer> transfer_of(nb::object transfer);

}  // namespace draftfeed::python
