// The options objects (LoaderOptions, OnlineSourceOptions) are built in Python from keyword
// arguments, `_core.LoaderOptions(total_seq_len=4096, ...)`: each keyword is set through the
// property of that name, so each conversion (a torch dtype, a path, None) happens once, in that
// property's setter, and the defaults are C++'s. An unknown keyword is a TypeError naming it, as
// Python's own for a function, and so is a value of a type its property does not take.
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
    try {
      nb::setattr(built, name, value);
    } catch (nb::python_error& error) {
      if (!error.matches(PyExc_TypeError)) throw;
      // The property's conversion refused the value's type: say which keyword, as the caller wrote
      // it.
      throw nb::type_error((std::string(name.c_str()) + " cannot take the value " +
                            nb::cast<std::string>(nb::repr(value)) + " (" +
                            nb::cast<std::string>(nb::type_name(value.type())) + ")")
                               .c_str());
    }
  }
  new (self) Options(nb::cast<const Options&>(built));
}

}  // namespace draftfeed::python
