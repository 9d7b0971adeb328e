// The compiled module `draftfeed._core`. Python code imports it through `draftfeed/__init__.py`.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "draftfeed/common/error.h"

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  using draftfeed::ErrorKind;
  m.doc() = "draftfeed's C++ core";

  // draftfeed.Error kinds become the Python exceptions a user expects.
  static nb::object format_error =
      nb::exception<draftfeed::Error>(m, "FormatError", PyExc_ValueError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const draftfeed::Error& e) {
      switch (e.kind()) {
        case ErrorKind::kInvalidArgument:
          PyErr_SetString(PyExc_ValueError, e.what());
          return;
        case ErrorKind::kNotFound:
          PyErr_SetString(PyExc_FileNotFoundError, e.what());
          return;
        case ErrorKind::kIo:
          PyErr_SetString(PyExc_OSError, e.what());
          return;
        case ErrorKind::kTimeout:
          PyErr_SetString(PyExc_TimeoutError, e.what());
          return;
        case ErrorKind::kRuntime:
          PyErr_SetString(PyExc_RuntimeError, e.what());
          return;
        case ErrorKind::kFormat:
        case ErrorKind::kMismatch:
        case ErrorKind::kNonFinite:
        case ErrorKind::kUnsupported:
          PyErr_SetString(format_error.ptr(), e.what());
          return;
      }
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  namespace py = draftfeed::python;
  py::init_dataset(m);
  py::init_hidden(m);
  py::init_engine(m);
  py::init_transfer_source(m);
  py::init_mooncake(m);
  py::init_online(m);
  py::init_sampler(m);
  py::init_pack(m);
  py::init_fp8(m);
}
