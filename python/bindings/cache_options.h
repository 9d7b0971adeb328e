// The cache source's options (C++ CacheSourceOptions) as properties of an options class that
// holds them in its `cache` member (LoaderOptions, OnlineSourceOptions): bound once, under the
// same names in both.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <optional>
#include <string>

#include "draftfeed/common/dtype.h"
#include "draftfeed/source/cache_source.h"

namespace draftfeed::python {

namespace nb = nanobind;

template <typename O>
void bind_cache_options(nb::class_<O>& cls) {
  using seconds = std::chrono::duration<double>;
  cls.def_prop_rw(
         "hidden_states_path", [](const O& o) { return o.cache.hidden_states_path; },
         [](O& o, const std::optional<std::filesystem::path>& v) {
           o.cache.hidden_states_path = v ? v->string() : "";
         },
         nb::arg("value").none(), "the cache folder; None or empty: <data_path>/hidden_states")
      .def_prop_rw(
          "on_missing", [](const O& o) { return std::string(on_missing_name(o.cache.on_missing)); },
          [](O& o, const std::string& v) { o.cache.on_missing = parse_on_missing(v); },
          "a row without a cached file: 'generate' (the online source), 'skip', 'warn' or "
          "'raise'")
      .def_prop_rw(
          "lock_timeout", [](const O& o) { return o.cache.lock_timeout.count(); },
          [](O& o, double v) { o.cache.lock_timeout = seconds(v); },
          "seconds a writer's lock is waited for")
      .def_prop_rw(
          "lock_poll", [](const O& o) { return o.cache.lock_poll.count(); },
          [](O& o, double v) { o.cache.lock_poll = seconds(v); },
          "seconds between two tries of a writer's lock")
      .def_prop_rw(
          "fp8_dequantize_dtype",
          [](const O& o) { return std::string(torch_dtype_name(o.cache.fp8_dequantize_dtype)); },
          [](O& o, nb::handle v) {
            o.cache.fp8_dequantize_dtype =
                parse_torch_dtype(nb::str(v).c_str(), "fp8_dequantize_dtype");
          },
          "FP8 files' dequantize dtype, as FP8Transfer's: 'bfloat16', 'float16' or 'float32' "
          "(or the torch dtype)");
}

}  // namespace draftfeed::python
