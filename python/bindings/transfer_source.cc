// A sample source that calls a Python object with the hs-connectors transfer interface
// (`get_cached(file_idx)` returning a dict of torch tensors or None), so a Mooncake or custom
// transfer works with the engine. Slower than the native store: every sample takes the GIL for the
// call, and the tensors it returns are copied into the batch from their own memory (still one
// copy).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>

#include "bindings.h"
#include "draftfeed/pipeline/cache_source.h"
#include "sample_source.h"

namespace draftfeed::python {
namespace {

// Releases Python objects from any thread: takes the GIL to drop the reference.
std::shared_ptr<const void> hold(nb::object object) {
  return std::shared_ptr<const void>(new nb::object(std::move(object)), [](const void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<const nb::object*>(p);
  });
}

std::optional<HiddenDType> hidden_dtype_of(const std::string& name) {
  if (name == "torch.bfloat16") return HiddenDType::kBF16;
  if (name == "torch.float16") return HiddenDType::kF16;
  if (name == "torch.float32") return HiddenDType::kF32;
  return std::nullopt;
}

class PythonTransferSource : public SampleSource {
 public:
  PythonTransferSource(nb::object transfer, OnMissing on_missing)
      : transfer_(hold(std::move(transfer))), on_missing_(on_missing) {}

  FetchOutcome fetch(std::int64_t row, const IntArrayView& input_ids) override {
    nb::gil_scoped_acquire gil;
    const nb::object& transfer = *static_cast<const nb::object*>(transfer_.get());
    const std::string where = "row " + std::to_string(row);
    nb::object result = transfer.attr("get_cached")(row);
    if (result.is_none()) {
      const std::string message = where + ": the transfer has no cached hidden states";
      if (on_missing_ == OnMissing::kRaise) {
        return FetchOutcome::dropped(DropReason::kMissing, message, true);
      }
      return FetchOutcome::dropped(DropReason::kMissing, message);
    }
    nb::object hs = result["hidden_states"].attr("contiguous")();
    nb::object ids = result["token_ids"].attr("to")(nb::module_::import_("torch").attr("int64"));
    ids = ids.attr("contiguous")();
    const auto tokens = nb::cast<std::int64_t>(ids.attr("numel")());
    const auto* id_data =
        reinterpret_cast<const std::uint8_t*>(nb::cast<std::uintptr_t>(ids.attr("data_ptr")()));
    bool equal = tokens == input_ids.size();
    for (std::int64_t t = 0; equal && t < tokens; ++t) {
      std::int64_t value;
      std::memcpy(&value, id_data + t * 8, 8);
      equal = value == input_ids[t];
    }
    if (!equal) {
      return FetchOutcome::dropped(DropReason::kMismatch,
                                   where + ": token ids from the transfer do not match the row");
    }
    const auto dtype = hidden_dtype_of(nb::cast<std::string>(hs.attr("dtype").attr("__repr__")()));
    const auto shape = nb::cast<std::vector<std::int64_t>>(nb::list(hs.attr("shape")));
    if (!dtype || shape.size() != 3 || shape[0] != tokens) {
      return FetchOutcome::dropped(DropReason::kInvalid,
                                   where +
                                       ": hidden_states from the transfer must be bf16/f16/f32 "
                                       "[T, L, H] with T = " +
                                       std::to_string(tokens));
    }
    FetchedSample sample;
    sample.hidden = HiddenStatesView{
        reinterpret_cast<const std::uint8_t*>(nb::cast<std::uintptr_t>(hs.attr("data_ptr")())),
        *dtype, shape[0], shape[1], shape[2]};
    sample.owner = hold(hs);
    return FetchOutcome::ok(std::move(sample));
  }

 private:
  std::shared_ptr<const void> transfer_;
  OnMissing on_missing_;
};

void init_transfer_source(nb::module_& m) {
  m.def(
      "python_transfer_source",
      [](nb::object transfer, const std::string& on_missing) {
        for (const char* method : {"get_cached"}) {
          require(nb::hasattr(transfer, method), ErrorKind::kInvalidArgument,
                  std::string("transfer object has no ") + method + "() method");
        }
        return PySampleSource{std::make_shared<PythonTransferSource>(std::move(transfer),
                                                                     parse_on_missing(on_missing)),
                              "python transfer"};
      },
      nb::arg("transfer"), nb::arg("on_missing") = "skip",
      "A SampleSource calling transfer.get_cached(file_idx) (hs-connectors interface) per sample.");
}

const BindingRegistration registration(60, init_transfer_source);

}  // namespace
}  // namespace draftfeed::python
