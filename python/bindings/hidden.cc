// Python bindings of the hidden-state store (for tests, benchmarks and tools):
//   draftfeed.load_safetensors(path) -> dict[str, numpy.ndarray]   (zero-copy, read-only)
//   draftfeed.safetensors_metadata(path) -> dict[str, str] | None
//   draftfeed.write_safetensors(path, [(name, dtype, shape, bytes)], metadata=None, atomic=True)
//   draftfeed.serialize_safetensors([(name, dtype, shape, bytes)], metadata=None) -> bytes
//   draftfeed.HiddenStateStore(root, allowed_folders=[], lock_timeout=10.0, lock_poll=0.1,
//                              probe_locks=False, force_copy_on_adopt=False, layout="flat")
//       .lookup(row) / .load(path) -> dict | None, .adopt(row, source), .remove(path),
//       .path_for(row), .confine(path)
//   draftfeed.validate_hidden_states(path, ids, row=-1) -> dict (ok, problem, message, counts)
//   draftfeed.write_synthetic_hidden_states(root, rows, seed, hidden_size, layers, dtype, threads)
//   draftfeed.synthetic_hidden_value(seed, row, position, layer, h) -> float
// and, under draftfeed._core only, the kernels for direct tests: hidden_all_finite,
// hidden_count_nonfinite_per_slot, hidden_finite_kernel, hidden_convert_bits.
// BF16 tensors come back as uint16 arrays of the raw bits (numpy has no bfloat16); F8 as uint8
// arrays of the codes (shaped); F6/F4 as flat uint8 arrays of the raw bytes. Every array keeps its
// file mapped (its owner holds the file). Blocking calls (lock waits, file I/O, scans) release the
// GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/finite.h"
#include "draftfeed/hidden/cache_layout.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/hidden/safetensors_writer.h"
#include "draftfeed/hidden/synthetic_cache.h"
#include "draftfeed/hidden/validate.h"

namespace draftfeed::python {

namespace {

using namespace nb::literals;

using ReadOnlyArray = nb::ndarray<nb::numpy, nb::ro>;
using BytesInput = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64Input = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// (name, dtype name, shape, raw bytes): a tensor to write.
using TensorTuple = std::tuple<std::string, std::string, std::vector<std::int64_t>, nb::bytes>;

Error invalid(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

DType dtype_of(const std::string& name) {
  const auto dtype = dtype_from_name(name);
  if (!dtype) throw invalid("unknown safetensors dtype '" + name + "'");
  return *dtype;
}

// The numpy view of a tensor's element type; sub-byte and F8 types are exposed as raw bytes.
std::optional<nb::dlpack::dtype> numpy_dtype(DType dtype) {
  using nb::dlpack::dtype_code;
  auto make = [](dtype_code code, unsigned bits) {
    return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (dtype) {
    case DType::kBool:
      return make(dtype_code::Bool, 8);
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      return make(dtype_code::Int, dtype_bits(dtype));
    case DType::kU8:
    case DType::kU16:
    case DType::kU32:
    case DType::kU64:
    case DType::kBF16:  // raw bits
      return make(dtype_code::UInt, dtype_bits(dtype));
    case DType::kF16:
    case DType::kF32:
    case DType::kF64:
      return make(dtype_code::Float, dtype_bits(dtype));
    case DType::kC64:
      return make(dtype_code::Complex, 64);
    case DType::kF8E5M2:
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kF8E4M3Fnuz:
    case DType::kF8E5M2Fnuz:  // one byte per element: raw codes, shaped
      return make(dtype_code::UInt, 8);
    default:
      return std::nullopt;  // F6, F4: raw bytes
  }
}

// A read-only numpy array over `view`, owned by a capsule holding `owner`.
nb::object array_of(const TensorView& view, const std::shared_ptr<const void>& owner) {
  static const std::uint8_t kEmpty[8] = {};
  auto* keep = new std::shared_ptr<const void>(owner);
  nb::capsule capsule(
      keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  const auto dtype = numpy_dtype(view.dtype);
  std::vector<std::size_t> shape;
  if (dtype) {
    for (const auto d : view.shape) shape.push_back(static_cast<std::size_t>(d));
  } else {
    shape.push_back(view.nbytes);
  }
  const void* data = view.nbytes == 0 ? static_cast<const void*>(kEmpty) : view.data;
  ReadOnlyArray array(data, shape.size(), shape.data(), capsule, nullptr,
                      dtype.value_or(nb::dtype<std::uint8_t>()));
  return array.cast();
}

nb::dict tensors_of(const std::shared_ptr<const SafetensorsFile>& file) {
  nb::dict out;
  for (const auto& view : file->tensors()) out[view.name.c_str()] = array_of(view, file);
  return out;
}

std::shared_ptr<const SafetensorsFile> open_file(const std::string& path) {
  Result<std::shared_ptr<const SafetensorsFile>> file = [&] {
    nb::gil_scoped_release release;
    return SafetensorsFile::open(path);
  }();
  return std::move(file).value();
}

nb::object sample_dict(const std::optional<HiddenStateSample>& sample) {
  if (!sample) return nb::none();
  nb::dict out;
  out["token_ids"] = array_of(sample->token_ids, sample->file);
  out["hidden_states"] = array_of(sample->hidden_states, sample->file);
  out["hidden_states_dtype"] = std::string(dtype_name(sample->hidden_states.dtype));
  if (sample->scales) out["hidden_states_scales"] = array_of(*sample->scales, sample->file);
  out["path"] = sample->path();
  return out;
}

std::vector<TensorToWrite> tensors_to_write(const std::vector<TensorTuple>& tensors) {
  std::vector<TensorToWrite> out;
  out.reserve(tensors.size());
  for (const auto& [name, dtype, shape, bytes] : tensors) {
    out.push_back(TensorToWrite{
        name,
        dtype_of(dtype),
        shape,
        {static_cast<const std::uint8_t*>(static_cast<const void*>(bytes.c_str())), bytes.size()}});
  }
  return out;
}

nb::dict check_dict(const SampleCheck& check) {
  nb::dict out;
  out["ok"] = check.ok();
  out["problem"] = std::string(sample_problem_name(check.problem));
  out["message"] = check.message;
  out["nan_count"] = check.nan_count;
  out["inf_count"] = check.inf_count;
  nb::list per_layer;
  for (const auto& counts : check.per_layer)
    per_layer.append(nb::make_tuple(counts.nan, counts.inf));
  out["per_layer"] = per_layer;
  out["nonfinite_layers"] = check.nonfinite_layers;
  return out;
}

}  // namespace

void init_hidden(nb::module_& m) {
  m.def(
      "default_hidden_states_path",
      [](const std::filesystem::path& data_path) {
        return default_hidden_states_path(data_path.string());
      },
      nb::arg("data_path"), "the cache folder of a dataset when none is named");
  m.def(
      "load_safetensors", [](const std::string& path) { return tensors_of(open_file(path)); },
      "path"_a,
      "Maps a safetensors file and returns {name: read-only numpy array} without copying (BF16 "
      "as uint16 bits, F8 as uint8 codes, F6/F4 as raw uint8 bytes). Raises FormatError naming "
      "the problem.");
  m.def(
      "safetensors_metadata",
      [](const std::string& path) -> std::optional<std::map<std::string, std::string>> {
        auto file = open_file(path);
        if (!file->has_metadata()) return std::nullopt;
        return file->metadata();
      },
      "path"_a, "The file's __metadata__ map, or None when it has none.");
  m.def(
      "safetensors_layout",
      [](const std::string& path) {
        auto file = open_file(path);
        nb::list out;
        for (const auto& view : file->tensors()) {
          out.append(nb::make_tuple(view.name, std::string(dtype_name(view.dtype)), view.shape,
                                    view.file_offset, view.nbytes));
        }
        return out;
      },
      "path"_a, "[(name, dtype, shape, file offset, nbytes)] in file order.");
  m.def(
      "write_safetensors",
      [](const std::string& path, const std::vector<TensorTuple>& tensors,
         std::optional<std::map<std::string, std::string>> metadata, bool atomic) {
        const auto to_write = tensors_to_write(tensors);
        SafetensorsWriteOptions options;
        options.atomic = atomic;
        nb::gil_scoped_release release;
        write_safetensors(path, to_write, metadata ? &*metadata : nullptr, options);
      },
      "path"_a, "tensors"_a, "metadata"_a = nb::none(), "atomic"_a = true,
      "Writes [(name, dtype name, shape, raw bytes)] in the safetensors package's layout.");
  m.def(
      "serialize_safetensors",
      [](const std::vector<TensorTuple>& tensors,
         std::optional<std::map<std::string, std::string>> metadata) {
        const auto bytes =
            serialize_safetensors(tensors_to_write(tensors), metadata ? &*metadata : nullptr);
        return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      "tensors"_a, "metadata"_a = nb::none());

  nb::class_<CacheStore>(m, "HiddenStateStore",
                         "The hs_<row>.safetensors cache folder with the producer's lock protocol.")
      .def(
          "__init__",
          [](CacheStore* self, const std::string& root, std::vector<std::string> allowed_folders,
             double lock_timeout, double lock_poll, bool probe_locks, bool force_copy_on_adopt,
             const std::string& layout) {
            CacheStoreOptions options;
            options.root = root;
            options.layout = parse_cache_layout(layout);
            options.allowed_folders = std::move(allowed_folders);
            options.lock_timeout = std::chrono::duration<double>(lock_timeout);
            options.lock_poll = std::chrono::duration<double>(lock_poll);
            options.lock_mode = probe_locks ? LockMode::kProbe : LockMode::kWait;
            options.force_copy_on_adopt = force_copy_on_adopt;
            new (self) CacheStore(std::move(options));
          },
          "root"_a, "allowed_folders"_a = std::vector<std::string>{}, "lock_timeout"_a = 10.0,
          "lock_poll"_a = 0.1, "probe_locks"_a = false, "force_copy_on_adopt"_a = false,
          "layout"_a = "flat",
          "layout: where adopt() and path_for() put files, 'flat' (root/hs_<row>.safetensors) or "
          "'sharded' (root/<row // 1000, 4 digits>/hs_<row>.safetensors); lookup() finds a row's "
          "file in either")
      .def_prop_ro("root", &CacheStore::root)
      .def("path_for", &CacheStore::path_for, "row"_a)
      .def(
          "lookup",
          [](const CacheStore& self, std::int64_t row) {
            Result<std::optional<HiddenStateSample>> found = [&] {
              nb::gil_scoped_release release;
              return self.lookup(row);
            }();
            return sample_dict(found.value());
          },
          "row"_a,
          "The cached sample of `row` as {token_ids, hidden_states, hidden_states_dtype, path}, "
          "or None when there is no file. Waits for a writer's lock as the reference does.")
      .def(
          "load",
          [](const CacheStore& self, const std::string& path) {
            Result<std::optional<HiddenStateSample>> found = [&] {
              nb::gil_scoped_release release;
              return self.load(path);
            }();
            return sample_dict(found.value());
          },
          "path"_a)
      .def("adopt", &CacheStore::adopt, "row"_a, "source"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("remove", &CacheStore::remove, "path"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "confine",
          [](const CacheStore& self, const std::string& path) {
            return self.confine(path).value();
          },
          "path"_a);

  m.def(
      "validate_hidden_states",
      [](const std::string& path, const Int64Input& ids, std::int64_t row) {
        auto file = open_file(path);
        const std::span<const std::int64_t> span(ids.data(), ids.shape(0));
        SampleCheck check = [&] {
          nb::gil_scoped_release release;
          return validate_file(file, RowIds(span), row);
        }();
        return check_dict(check);
      },
      "path"_a, "ids"_a, "row"_a = -1,
      "Checks a hidden-state file against a row's ids: {ok, problem, message, nan_count, "
      "inf_count, per_layer: [(nan, inf)], nonfinite_layers}. Raises FormatError when the file "
      "itself is unreadable.");
  m.def(
      "write_synthetic_hidden_states",
      [](const std::string& root, std::vector<std::vector<std::int64_t>> rows, std::uint64_t seed,
         std::int64_t hidden_size, std::int64_t layers, const std::string& dtype,
         unsigned threads) {
        SyntheticHiddenStateSpec spec;
        spec.seed = seed;
        spec.hidden_size = hidden_size;
        spec.layers = layers;
        spec.dtype = dtype_of(dtype);
        spec.threads = threads;
        nb::gil_scoped_release release;
        const auto stats = write_synthetic_hidden_states(root, rows, spec);
        return std::make_tuple(stats.files, stats.bytes);
      },
      "root"_a, "rows"_a, "seed"_a = 0, "hidden_size"_a = 64, "layers"_a = 4, "dtype"_a = "BF16",
      "threads"_a = 0, "Writes hs_<row>.safetensors for every row; returns (files, bytes).");
  m.def("synthetic_hidden_value", &synthetic_hidden_value, "seed"_a, "row"_a, "position"_a,
        "layer"_a, "h"_a);

  m.def(
      "hidden_all_finite",
      [](const BytesInput& bytes, std::size_t offset, std::size_t count, const std::string& dtype) {
        const DType type = dtype_of(dtype);
        const std::size_t width = dtype_size(type);
        if (offset > bytes.shape(0) || count > (bytes.shape(0) - offset) / (width ? width : 1)) {
          throw invalid("range past the end of the buffer");
        }
        return all_finite(bytes.data() + offset, count, type);
      },
      "bytes"_a, "offset"_a, "count"_a, "dtype"_a);
  m.def(
      "hidden_count_nonfinite_per_slot",
      [](const BytesInput& bytes, std::int64_t rows, std::int64_t slots, std::int64_t width,
         const std::string& dtype) {
        const DType type = dtype_of(dtype);
        if (rows < 0 || slots < 0 || width < 0 ||
            static_cast<std::size_t>(rows * slots * width) * (dtype_size(type)) > bytes.shape(0)) {
          throw invalid("shape past the end of the buffer");
        }
        std::vector<std::tuple<std::int64_t, std::int64_t>> out;
        for (const auto& c : count_nonfinite_per_slot(bytes.data(), rows, slots, width, type)) {
          out.emplace_back(c.nan, c.inf);
        }
        return out;
      },
      "bytes"_a, "rows"_a, "slots"_a, "width"_a, "dtype"_a);
  m.def("hidden_finite_kernel", [] { return std::string(finite_scan_kernel()); });
  m.def(
      "hidden_convert_bits",
      [](const nb::ndarray<const std::uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>& in,
         const std::string& op) {
        // Conversions on bit patterns held in uint32: "f16_to_f32", "f32_to_f16", "f32_to_bf16",
        // "bf16_to_f32" (16-bit patterns in the low half).
        if (op != "f16_to_f32" && op != "bf16_to_f32" && op != "f32_to_f16" &&
            op != "f32_to_bf16") {
          throw invalid("unknown conversion '" + op + "'");
        }
        std::vector<std::uint32_t> out(in.shape(0));
        for (std::size_t i = 0; i < out.size(); ++i) {
          const std::uint32_t x = in(i);
          float f;
          std::memcpy(&f, &x, 4);
          if (op == "f16_to_f32") {
            const float v = f16_to_float(static_cast<std::uint16_t>(x));
            std::memcpy(&out[i], &v, 4);
          } else if (op == "bf16_to_f32") {
            const float v = bf16_to_float(static_cast<std::uint16_t>(x));
            std::memcpy(&out[i], &v, 4);
          } else if (op == "f32_to_f16") {
            out[i] = float_to_f16(f);
          } else {
            out[i] = float_to_bf16(f);
          }
        }
        return out;
      },
      "bits"_a, "op"_a);
}

}  // namespace draftfeed::python
