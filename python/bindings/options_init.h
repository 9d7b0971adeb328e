// The options objects (LoaderOptions, OnlineSourceOptions) are built in Python from keyword
// arguments, `_core.LoaderOptions(total_seq_len=4096, ...)`: each keyword is set through the
// property of that name, so each conversion (a torch dtype, a path, None) happens once, in that
// property's setter, and the defaults are C++'s. An unknown keyword is a TypeError naming it, as
// Python's own for a function.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

namespace draftfeed::python {

namespace nb = nanobind;

template <typename Options>
void init_from_kwargs(Options* self, const nb::kwargs& kwargs) {
  if (kwargs.size() == 0) {
    new (self) Options();
    return;
  }
  // Set on a ready instance (this one is not until __init__ returns), then copied.
  const nb::object type = nb::borrow(nb::type<Options>());
  const nb::object built = type();
  const nb::object property = nb::module_::import_("builtins").attr("property");
  const nb::object attributes = type.attr("__dict__");  // a mapping proxy
  for (auto [key, value] : kwargs) {
    const nb::str name = nb::borrow<nb::str>(key);
    if (!nb::isinstance(attributes.attr("get")(name), property)) {
      throw nb::type_error((nb::cast<std::string>(type.attr("__name__")) +
                            "() got an unexpected keyword argument '" + name.c_str() + "'")
                               .c_str());
    }
    nb::setattr(built, name, value);
  }
  new (self) Options(nb::cast<const Options&>(built));
}

}  // namespace draftfeed::python
