// A HiddenStatesTransfer that calls a Python object with hs-connectors' interface:
// `get_cached(idx)` and `get_generated(kv_transfer_params)` returning a dict of torch tensors
// (`token_ids`, `hidden_states`) or None, `setup()`, `delete(handle)` and, when it has one,
// `cache(handle, idx)`. Every call takes the GIL, so this is slower than the native store; the
// tensors it returns are copied into the batch from their own memory (still one copy), and released
// under the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "draftfeed/source/hidden_states_transfer.h"

namespace draftfeed::python {

namespace nb = nanobind;

// Throws kInvalidArgument when `transfer` lacks get_cached (and, with `generating`, get_generated
// or delete).
std::shared_ptr<HiddenStatesTransfer> make_python_transfer(nb::object transfer, bool generating);

}  // namespace draftfeed::python
