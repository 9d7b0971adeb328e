// The binding areas of `draftfeed._core`, one file each (`<area>.cc`). module.cc calls their init
// functions in this order: an area's types are registered before the areas that use them.
#pragma once

#include <nanobind/nanobind.h>

namespace draftfeed::python {

namespace nb = nanobind;

void init_dataset(nb::module_& m);          // dataset.cc: datasets, splits, writers
void init_hidden(nb::module_& m);           // hidden.cc: safetensors, the cache store, validation
void init_engine(nb::module_& m);           // engine.cc: sample sources, batches, the engine
void init_transfer_source(nb::module_& m);  // transfer_source.cc: a Python transfer as a source
void init_mooncake(nb::module_& m);         // mooncake.cc: the native Mooncake transfer
void init_online(nb::module_& m);           // online.cc: the vLLM client and the online source
void init_sampler(nb::module_& m);          // sampler.cc: numpy's permutation, the planner
void init_pack(nb::module_& m);             // pack.cc: the collate for a preprocess callable
void init_fp8(nb::module_& m);              // fp8.cc: E4M3 conversions, quantize, dequantize

}  // namespace draftfeed::python
