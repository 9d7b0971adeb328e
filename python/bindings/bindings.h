// Each binding file (`<area>.cc`) registers an init function here through a static
// `BindingRegistration`, so adding an area touches no other file. `module.cc` runs them in order of
// their `order` value (types used by later areas first).
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

namespace draftfeed::python {

namespace nb = nanobind;

using BindingInit = void (*)(nb::module_& m);

struct BindingEntry {
  int order;
  BindingInit init;
};

std::vector<BindingEntry>& binding_registry();

struct BindingRegistration {
  BindingRegistration(int order, BindingInit init) { binding_registry().push_back({order, init}); }
};

}  // namespace draftfeed::python
