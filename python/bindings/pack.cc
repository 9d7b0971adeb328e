// Python binding of the native collate for a user's preprocess callable (batch/pack.h):
//   draftfeed._core.pack_samples(samples, max_len, hidden_states_dtype, pin_memory) -> dict
// `samples` are the dicts the callable returned (torch tensors on the CPU); the result holds the
// batch's tensors in the reference's key order, views of one buffer (page-locked when a CUDA
// runtime is present and pin_memory is set), plus document_ids.
#include "draftfeed/batch/pack.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dlpack_dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/cuda/cuda_runtime.h"
#include "draftfeed/pipeline/host_memory.h"

namespace draftfeed::python {
namespace {

using AnyTensor = nb::ndarray<nb::ro, nb::device::cpu>;

std::optional<DType> dtype_of(nb::dlpack::dtype dl) {
  using Code = nb::dlpack::dtype_code;
  if (dl.lanes != 1) return std::nullopt;
  switch (static_cast<Code>(dl.code)) {
    case Code::Bool:
      return DType::kBool;
    case Code::Int:
      return dl.bits == 8    ? std::optional(DType::kI8)
             : dl.bits == 16 ? std::optional(DType::kI16)
             : dl.bits == 32 ? std::optional(DType::kI32)
             : dl.bits == 64 ? std::optional(DType::kI64)
                             : std::nullopt;
    case Code::UInt:
      return dl.bits == 8    ? std::optional(DType::kU8)
             : dl.bits == 16 ? std::optional(DType::kU16)
             : dl.bits == 32 ? std::optional(DType::kU32)
             : dl.bits == 64 ? std::optional(DType::kU64)
                             : std::nullopt;
    case Code::Float:
      return dl.bits == 16   ? std::optional(DType::kF16)
             : dl.bits == 32 ? std::optional(DType::kF32)
             : dl.bits == 64 ? std::optional(DType::kF64)
                             : std::nullopt;
    case Code::Bfloat:
      return dl.bits == 16 ? std::optional(DType::kBF16) : std::nullopt;
    default:
      return std::nullopt;
  }
}

// The callable's sample: every value must be a CPU tensor whose trailing dimensions are
// contiguous (the Python side passes `.contiguous()` ones).
SampleArg sample_of(nb::handle object, std::size_t index, std::vector<AnyTensor>& keep) {
  const std::string where = "preprocess returned sample " + std::to_string(index);
  require(nb::isinstance<nb::dict>(object), ErrorKind::kInvalidArgument,
          where + ": not a dict but " + nb::cast<std::string>(nb::str(object.type())));
  SampleArg sample;
  for (auto [key, value] : nb::borrow<nb::dict>(object)) {
    const std::string name = nb::cast<std::string>(nb::str(key));
    AnyTensor tensor;
    if (!nb::try_cast(value, tensor)) {
      throw Error(ErrorKind::kInvalidArgument, where + ": '" + name + "' is not a CPU tensor but " +
                                                   nb::cast<std::string>(nb::str(value.type())));
    }
    const std::optional<DType> dtype = dtype_of(tensor.dtype());
    // Messages are built only when thrown: this runs for every tensor of every sample.
    if (!dtype.has_value()) {
      throw Error(ErrorKind::kInvalidArgument,
                  where + ": '" + name + "' has a dtype the collate does not take");
    }
    TensorArg arg;
    arg.data = static_cast<const std::uint8_t*>(tensor.data());
    arg.dtype = *dtype;
    const std::size_t item = dtype_size(*dtype);
    std::int64_t expected = static_cast<std::int64_t>(item);  // bytes of a contiguous suffix
    for (std::size_t d = tensor.ndim(); d-- > 1;) {
      if (tensor.shape(d) > 1 && tensor.stride(d) * static_cast<std::int64_t>(item) != expected) {
        throw Error(ErrorKind::kInvalidArgument,
                    where + ": '" + name + "' is not contiguous within its rows");
      }
      expected *= static_cast<std::int64_t>(tensor.shape(d));
    }
    for (std::size_t d = 0; d < tensor.ndim(); ++d) {
      arg.shape.push_back(static_cast<std::int64_t>(tensor.shape(d)));
    }
    arg.row_stride_bytes =
        tensor.ndim() > 0 ? tensor.stride(0) * static_cast<std::int64_t>(item) : 0;
    sample.keys.push_back(name);
    sample.tensors.push_back(std::move(arg));
    keep.push_back(std::move(tensor));
  }
  return sample;
}

nb::dict pack(const nb::list& samples, std::int64_t max_len, const std::string& hidden_states_dtype,
              bool pin_memory, std::uintptr_t consumer_stream, int cuda_device) {
  DType hidden;
  if (hidden_states_dtype == "bfloat16") {
    hidden = DType::kBF16;
  } else if (hidden_states_dtype == "float32") {
    hidden = DType::kF32;
  } else {
    throw Error(
        ErrorKind::kInvalidArgument,
        "hidden_states_dtype must be bfloat16 or float32, got '" + hidden_states_dtype + "'");
  }
  std::vector<AnyTensor> keep;  // the inputs stay referenced while they are read
  std::vector<SampleArg> args;
  for (std::size_t s = 0; s < samples.size(); ++s) args.push_back(sample_of(samples[s], s, keep));
  const PackedLayout layout = layout_packed(args, max_len, hidden);
  std::shared_ptr<HostBuffer> buffer;
  {
    nb::gil_scoped_release release;
    std::shared_ptr<DeviceWorker> pin_with;
    if (pin_memory) {
      std::string why;
      pin_with = DeviceWorker::for_device(resolve_cuda_device(cuda_device), &why);
    }
    buffer = std::make_shared<HostBuffer>(std::max<std::size_t>(layout.total_bytes, 64), pin_with);
    pack_samples(args, max_len, layout, buffer->data());
  }
  struct Holder {
    std::shared_ptr<HostBuffer> buffer;
    CudaStream consumer_stream;
  };
  auto* holder = new Holder{buffer, cuda_stream_from_handle(consumer_stream)};
  nb::capsule owner(holder, [](void* p) noexcept {
    auto* held = static_cast<Holder*>(p);
    // Copies the consumer queued from the batch were queued before it let the tensors go.
    if (const auto& fence = held->buffer->fence()) fence->mark_reads_on(held->consumer_stream);
    delete held;
  });
  nb::dict out;
  for (const PackedTensor& t : layout.tensors) {
    std::vector<std::size_t> shape(t.shape.begin(), t.shape.end());
    out[t.name.c_str()] = nb::ndarray<nb::pytorch>(
        buffer->data() + t.offset, shape.size(), shape.data(), owner, nullptr, dlpack_of(t.dtype));
  }
  return out;
}

}  // namespace

void init_pack(nb::module_& m) {
  m.def("pack_samples", &pack, nb::arg("samples"), nb::arg("max_len"),
        nb::arg("hidden_states_dtype") = "bfloat16", nb::arg("pin_memory") = false,
        nb::arg("consumer_stream") = 0, nb::arg("cuda_device") = -1,
        "Packs the dicts a preprocess callable returned into one batch, as speculators' collate "
        "does: every key but `lengths` as [1, max_len, ...] (hidden-state keys in "
        "hidden_states_dtype, others in the first sample's dtype), rows back to back and "
        "truncated at max_len, then document_ids. Returns a dict of torch tensors. With "
        "pin_memory, the batch is page-locked on cuda_device (-1: LOCAL_RANK, else 0) and freed "
        "only after the copies queued from it on consumer_stream have run.");
}

}  // namespace draftfeed::python
