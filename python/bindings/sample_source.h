// A sample source made by one binding area (the online client, a Python transfer) and handed to
// `Engine(source=...)` by Python code: the engines' sources are pluggable without the engine
// binding knowing them.
#pragma once

#include <memory>
#include <string>

#include "draftfeed/batch/sample.h"

namespace draftfeed::python {

struct PySampleSource {
  std::shared_ptr<SampleSource> source;
  std::string description;
};

}  // namespace draftfeed::python
