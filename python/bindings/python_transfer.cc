#include "python_transfer.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "draftfeed/common/fault_guard.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed::python {
namespace {

// Releases a Python object from any thread: takes the GIL to drop the reference.
std::shared_ptr<const void> hold(nb::object object) {
  return std::shared_ptr<const void>(new nb::object(std::move(object)), [](const void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<const nb::object*>(p);
  });
}

// str(object), as Python prints it.
std::string text_of(const nb::handle& object) { return nb::str(object).c_str(); }

// "ConnectionError: the store lost this sample", as the reference logs an exception (what() would
// add the whole traceback). Needs the GIL.
std::string exception_text(const nb::python_error& error) {
  return text_of(error.type().attr("__name__")) + ": " + text_of(error.value());
}

const std::uint8_t* data_of(const nb::object& tensor) {
  // data_ptr() is the tensor's address, as an integer: the cast is the point.
  return reinterpret_cast<const std::uint8_t*>(  // NOLINT(performance-no-int-to-ptr)
      nb::cast<std::uintptr_t>(tensor.attr("data_ptr")()));
}

// Checks a transfer's result dict against the row and views its hidden states. Needs the GIL.
// Errors: kFormat (not a dict of the two tensors, wrong dtype or shape), kMismatch (token ids).
Result<FetchedSample> sample_from(const nb::object& result, const RowIds& ids,
                                  const std::string& where) {
  if (!nb::isinstance<nb::dict>(result) || !result.attr("__contains__")("token_ids") ||
      !result.attr("__contains__")("hidden_states")) {
    return Error(ErrorKind::kFormat,
                 where + ": the transfer must return a dict with token_ids and hidden_states");
  }
  const nb::object torch = nb::module_::import_("torch");
  nb::object token_ids = result["token_ids"];
  nb::object hs = result["hidden_states"];
  if (!nb::isinstance(token_ids, torch.attr("Tensor")) ||
      !nb::isinstance(hs, torch.attr("Tensor"))) {
    return Error(ErrorKind::kFormat, where + ": token_ids and hidden_states must be torch tensors");
  }
  const nb::object cpu = torch.attr("device")("cpu");
  nb::object id_tensor = token_ids.attr("to")(cpu, torch.attr("int64")).attr("contiguous")();
  const auto tokens = nb::cast<std::int64_t>(id_tensor.attr("numel")());
  if (nb::cast<std::int64_t>(id_tensor.attr("dim")()) != 1 || tokens != ids.size()) {
    return Error(ErrorKind::kMismatch, where + ": token_ids from the transfer have " +
                                           std::to_string(tokens) + " values, the row has " +
                                           std::to_string(ids.size()));
  }
  const std::uint8_t* id_data = data_of(id_tensor);
  // The row's ids lie in the dataset's mapped shard: compared under the fault guard.
  std::int64_t at = -1;
  std::int64_t value = 0;
  std::int64_t row_value = 0;
  const bool read = guard_mapped_reads([&] {
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::memcpy(&value, id_data + t * 8, 8);
      row_value = ids[t];
      if (value != row_value) {
        at = t;
        return;
      }
    }
  });
  if (!read) {
    return Error(ErrorKind::kIo, where + ": " + unreadable_row(ids.view(), -1, "input_ids").what());
  }
  if (at >= 0) {
    return Error(ErrorKind::kMismatch, where + ": token_ids from the transfer differ from the " +
                                           "row at position " + std::to_string(at) + " (" +
                                           std::to_string(value) + " vs " +
                                           std::to_string(row_value) + ")");
  }
  hs = hs.attr("to")(cpu).attr("contiguous")();
  const auto dtype = dtype_from_torch_name(text_of(hs.attr("dtype")));
  const auto shape = nb::cast<std::vector<std::int64_t>>(nb::list(hs.attr("shape")));
  if ((dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) ||
      shape.size() != 3 || shape[0] != tokens) {
    return Error(ErrorKind::kFormat, where +
                                         ": hidden_states from the transfer must be bf16/f16/f32 "
                                         "[T, L, H] with T = " +
                                         std::to_string(tokens) + ", got " +
                                         text_of(hs.attr("dtype")) + " " +
                                         text_of(hs.attr("shape")));
  }
  FetchedSample sample;
  sample.hidden = HiddenStatesView{data_of(hs), *dtype, shape[0], shape[1], shape[2]};
  sample.owner = hold(hs);
  return sample;
}

class PythonTransfer : public HiddenStatesTransfer {
 public:
  explicit PythonTransfer(nb::object transfer) : transfer_(hold(std::move(transfer))) {}

  void setup() override {
    nb::gil_scoped_acquire gil;
    if (!nb::hasattr(object(), "setup")) return;
    try {
      object().attr("setup")();
    } catch (const nb::python_error& e) {
      throw Error(ErrorKind::kRuntime, "transfer.setup(): " + exception_text(e));
    }
  }

  FetchOutcome get_cached(std::int64_t row, const IntArrayView& input_ids) override {
    nb::gil_scoped_acquire gil;
    const std::string where = "row " + std::to_string(row);
    try {
      nb::object result = object().attr("get_cached")(row);
      if (result.is_none()) {
        return FetchOutcome::dropped(DropReason::kMissing,
                                     where + ": the transfer has no cached hidden states");
      }
      Result<FetchedSample> sample = sample_from(result, RowIds(input_ids), where);
      if (sample.ok()) return FetchOutcome::ok(std::move(sample).value());
      return FetchOutcome::dropped(sample.error().kind() == ErrorKind::kMismatch
                                       ? DropReason::kMismatch
                                       : DropReason::kInvalid,
                                   sample.error().what());
    } catch (const nb::python_error&) {
      // The reference lets an exception from get_cached end the run: it reaches the trainer as
      // the transfer raised it (the pipeline carries it to next(), which re-raises it in Python).
      throw;
    }
  }

  Result<FetchedSample> get_generated(const std::string& transfer_params, const std::string& handle,
                                      std::int64_t row,
                                      std::span<const std::int64_t> ids) override {
    nb::gil_scoped_acquire gil;
    const std::string where = "row " + std::to_string(row) + ", handle " + handle;
    try {
      nb::object params = nb::module_::import_("json").attr("loads")(transfer_params);
      nb::object result = object().attr("get_generated")(params);
      if (result.is_none()) {
        return Error(ErrorKind::kNotFound,
                     where + ": the transfer's get_generated found no hidden states");
      }
      return sample_from(result, RowIds(ids), where);
    } catch (const nb::python_error& e) {
      return Error(ErrorKind::kRuntime,
                   where + ": transfer.get_generated raised " + exception_text(e));
    }
  }

  bool cache(const std::string& handle, std::int64_t row) override {
    nb::gil_scoped_acquire gil;
    if (!nb::hasattr(object(), "cache")) return false;
    try {
      object().attr("cache")(handle, row);
      return true;
    } catch (const nb::python_error& e) {
      throw Error(ErrorKind::kRuntime, "transfer.cache(" + handle + "): " + exception_text(e));
    }
  }

  void remove(const std::string& handle) override {
    nb::gil_scoped_acquire gil;
    try {
      object().attr("delete")(handle);
    } catch (const nb::python_error& e) {
      throw Error(ErrorKind::kRuntime, "transfer.delete(" + handle + "): " + exception_text(e));
    }
  }

 private:
  const nb::object& object() const { return *static_cast<const nb::object*>(transfer_.get()); }

  std::shared_ptr<const void> transfer_;
};

}  // namespace

std::shared_ptr<HiddenStatesTransfer> make_python_transfer(nb::object transfer, bool generating) {
  std::vector<const char*> needed{"get_cached"};
  if (generating) needed.insert(needed.end(), {"get_generated", "delete"});
  for (const char* method : needed) {
    require(nb::hasattr(transfer, method), ErrorKind::kInvalidArgument,
            "transfer " + text_of(transfer.type().attr("__name__")) + " has no " + method +
                "() method");
  }
  return std::make_shared<PythonTransfer>(std::move(transfer));
}

}  // namespace draftfeed::python
