// Python bindings of the engine: `_core.Engine` runs the pipeline over planned batches and hands
// out
// `_core.Batch` objects whose tensors view the batch buffer without copying (DLPack). The Python
// loader classes (python/draftfeed/loader.py) build on these.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/pipeline/cache_source.h"
#include "draftfeed/pipeline/host_memory.h"
#include "draftfeed/pipeline/pipeline.h"
#include "sample_source.h"

namespace draftfeed::python {
namespace {

HiddenDType parse_batch_dtype(const std::string& text) {
  if (text == "bfloat16" || text == "bf16") return HiddenDType::kBF16;
  if (text == "float32" || text == "f32" || text == "float") return HiddenDType::kF32;
  if (text == "float16" || text == "f16" || text == "half")
    return HiddenDType::kF16;  // refused later
  throw Error(ErrorKind::kInvalidArgument,
              "hidden_states_dtype must be bfloat16 or float32, got '" + text + "'");
}

Preprocess parse_preprocess(const std::string& text) {
  if (text == "none" || text.empty()) return Preprocess::kNone;
  if (text == "eagle3" || text == "peagle" || text == "shift") return Preprocess::kEagle3Shift;
  if (text == "mtp") return Preprocess::kMtp;
  throw Error(ErrorKind::kInvalidArgument,
              "preprocess must be 'none', 'eagle3', 'peagle' or 'mtp', got '" + text + "'");
}

NoiseKind parse_noise(const std::string& text) {
  if (text == "uniform") return NoiseKind::kUniform;
  if (text == "gaussian" || text == "normal") return NoiseKind::kGaussian;
  if (text == "none") return NoiseKind::kNone;
  throw Error(ErrorKind::kInvalidArgument,
              "noise must be 'uniform', 'gaussian' or 'none', got '" + text + "'");
}

nb::dlpack::dtype dlpack_dtype(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kInt64:
      return nb::dtype<std::int64_t>();
    case TensorDType::kBool:
      return nb::dtype<bool>();
    case TensorDType::kBF16:
      return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case TensorDType::kF16:
      return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case TensorDType::kF32:
      return nb::dtype<float>();
  }
  return nb::dtype<std::uint8_t>();
}

// {reason name: samples dropped}.
nb::dict drop_counts(const DropCounts& counts) {
  nb::dict out;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    out[drop_reason_name(static_cast<DropReason>(r))] = counts[r];
  }
  return out;
}

// A delivered batch as Python sees it.
struct PyBatch {
  std::shared_ptr<BatchLease> lease;

  // Every tensor of the batch, in the reference's key order, as views of the batch buffer. The
  // capsule shared by the views keeps the lease (and so the buffer) until the last view is gone.
  template <typename Framework>
  nb::dict views(bool bf16_as_uint16) const {
    nb::dict out;
    auto* holder = new std::shared_ptr<BatchLease>(lease);
    nb::capsule owner(
        holder, [](void* p) noexcept { delete static_cast<std::shared_ptr<BatchLease>*>(p); });
    for (const TensorSlot& slot : lease->layout->tensors) {
      TensorDType dtype = slot.dtype;
      // The reference's all-padding batch has a bool loss mask (its empty sample's dtype).
      if (slot.name == "loss_mask" && lease->locally_empty) dtype = TensorDType::kBool;
      nb::dlpack::dtype dl = dlpack_dtype(dtype);
      if (bf16_as_uint16 && dtype == TensorDType::kBF16) dl = nb::dtype<std::uint16_t>();
      std::vector<std::size_t> shape(slot.shape.begin(), slot.shape.end());
      out[slot.name.c_str()] = nb::ndarray<Framework>(lease->data + slot.offset, shape.size(),
                                                      shape.data(), owner, nullptr, dl);
    }
    return out;
  }

  nb::dict dropped() const { return drop_counts(lease->dropped); }
};

struct PyEngine {
  std::shared_ptr<const TokenDataset> dataset;
  std::shared_ptr<Pipeline> pipeline;

  PyEngine() = default;
  PyEngine(PyEngine&&) = default;
  // Workers may need the GIL (a Python transfer): stop them with it released.
  ~PyEngine() {
    if (pipeline) {
      nb::gil_scoped_release release;
      pipeline.reset();
    }
  }

  void start(std::uint64_t epoch, const std::vector<std::int64_t>& indices,
             const std::vector<nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig>>& rows) {
    require(indices.size() == rows.size(), ErrorKind::kInvalidArgument,
            "start(): " + std::to_string(indices.size()) + " batch indices for " +
                std::to_string(rows.size()) + " batches");
    std::vector<PlannedBatch> batches(rows.size());
    const std::int64_t n_rows = dataset->num_rows();
    for (std::size_t b = 0; b < rows.size(); ++b) {
      batches[b].index = indices[b];
      const std::int64_t* begin = rows[b].data();
      batches[b].rows.assign(begin, begin + rows[b].shape(0));
      for (const std::int64_t row : batches[b].rows) {
        require(row >= 0 && row < n_rows, ErrorKind::kInvalidArgument,
                "batch " + std::to_string(indices[b]) + " names row " + std::to_string(row) +
                    ", outside the dataset's " + std::to_string(n_rows) + " rows");
      }
    }
    nb::gil_scoped_release release;
    pipeline->start(epoch, std::move(batches));
  }

  std::optional<PyBatch> next() {
    std::shared_ptr<BatchLease> lease;
    {
      nb::gil_scoped_release release;
      lease = pipeline->next();
    }
    if (!lease) return std::nullopt;
    return PyBatch{std::move(lease)};
  }

  nb::dict metrics() const {
    const PipelineMetrics m = pipeline->metrics();
    nb::dict out;
    out["batches"] = m.batches;
    out["tokens"] = m.tokens;
    out["hidden_bytes"] = m.hidden_bytes;
    out["batch_bytes"] = m.batch_bytes;
    out["consumer_wait_seconds"] = m.consumer_wait_seconds;
    out["first_batch_seconds"] = m.first_batch_seconds;
    out["elapsed_seconds"] = m.elapsed_seconds;
    out["ready"] = m.ready;
    out["in_flight"] = m.in_flight;
    out["buffers"] = m.buffers;
    out["extra_buffers"] = m.extra_buffers;
    out["pinned"] = m.pinned;
    out["buffer_bytes"] = m.buffer_bytes;
    out["dropped"] = drop_counts(m.dropped);
    return out;
  }
};

PyEngine make_engine(std::shared_ptr<SampleSource> custom_source, const std::string& data_path,
                     const std::string& hidden_states_path, std::int64_t total_seq_len,
                     std::int64_t hidden_size, std::int64_t num_target_layers,
                     const std::string& dtype, const std::string& preprocess,
                     const std::string& noise, double noise_std, std::uint64_t seed,
                     bool apply_noise, const std::string& on_missing, int num_threads, int prefetch,
                     bool in_order, bool pin_memory, double lock_timeout, std::int64_t chunk_bytes,
                     bool fatal_failures_in_batch, const std::string& fp8_dequantize) {
  BatchSpec spec;
  spec.max_len = total_seq_len;
  spec.hidden_size = hidden_size;
  spec.num_target_layers = num_target_layers;
  spec.dtype = parse_batch_dtype(dtype);
  spec.preprocess = parse_preprocess(preprocess);
  spec.noise = NoiseSpec{parse_noise(noise), noise_std, seed};
  BatchLayout layout = make_batch_layout(spec);

  CacheStoreOptions store_options;
  store_options.root = hidden_states_path;
  store_options.lock_timeout = std::chrono::duration<double>(lock_timeout);
  auto store = std::make_shared<const CacheStore>(store_options);
  std::shared_ptr<SampleSource> source = custom_source;
  if (!source) {
    source = std::make_shared<CacheSampleSource>(store, parse_on_missing(on_missing),
                                                 parse_fp8_dequantize(fp8_dequantize));
  }

  PipelineOptions options;
  options.num_threads = num_threads;
  options.prefetch = prefetch;
  options.in_order = in_order;
  options.try_pin = pin_memory;
  options.noise = apply_noise;
  options.fatal_failures_in_batch = fatal_failures_in_batch;
  if (chunk_bytes > 0) options.chunk_bytes = chunk_bytes;

  PyEngine engine;
  engine.dataset = TokenDataset::open(data_path);
  engine.pipeline = std::make_shared<Pipeline>(std::move(layout), engine.dataset, source, options);
  return engine;
}

void init_engine(nb::module_& m) {
  nb::class_<PySampleSource>(
      m, "SampleSource",
      "Where the engine gets hidden states (the cache by default; an online source from "
      "draftfeed.online). Pass one as Engine(source=...).")
      .def_ro("description", &PySampleSource::description)
      .def(
          "fetch_native",
          [](const PySampleSource& s, std::int64_t row, Int64Input ids) {
            nb::dict out;
            const FetchOutcome outcome = fetch_one(*s.source, row, ids, out);
            if (outcome.sample) {
              const HiddenStatesView& hs = outcome.sample->hidden;
              const auto count = static_cast<std::size_t>(hs.tokens * hs.layers * hs.hidden);
              if (hs.dtype == HiddenDType::kF8E4M3) {
                // As FP8Transfer hands it over: dequantized, in its dequantize dtype.
                const std::vector<std::uint8_t> values = dequantize_fp8_tensor(
                    hs.data, hs.scales, hs.tokens, hs.layers * hs.hidden, hs.dequantize);
                out["dtype"] = hidden_dtype_name(hs.dequantize);
                out["hidden_bytes"] =
                    nb::bytes(reinterpret_cast<const char*>(values.data()), values.size());
              } else {
                out["dtype"] = hidden_dtype_name(hs.dtype);
                out["hidden_bytes"] = nb::bytes(reinterpret_cast<const char*>(hs.data),
                                                count * hidden_dtype_size(hs.dtype));
              }
              out["shape"] = nb::make_tuple(hs.tokens, hs.layers, hs.hidden);
            }
            return out;
          },
          nb::arg("row"), nb::arg("input_ids"),
          "one row through the source (the slower per-sample paths): {ok, reason, message, "
          "fatal} and, when ok, the hidden states' dtype name, shape and bytes (a copy)");

  nb::class_<PyBatch>(m, "Batch", "A delivered batch; its tensors view the batch buffer.")
      .def_prop_ro(
          "index", [](const PyBatch& b) { return b.lease->index; },
          "the batch's position in the epoch's full plan")
      .def_prop_ro("tokens", [](const PyBatch& b) { return b.lease->tokens; })
      .def_prop_ro("planned_samples", [](const PyBatch& b) { return b.lease->planned_samples; })
      .def_prop_ro("used_samples", [](const PyBatch& b) { return b.lease->used_samples; })
      .def_prop_ro("locally_empty", [](const PyBatch& b) { return b.lease->locally_empty; })
      .def_prop_ro("failure_count", [](const PyBatch& b) { return b.lease->failure_count; })
      .def_prop_ro(
          "fatal", [](const PyBatch& b) { return b.lease->fatal; },
          "a fatal generation failure (Engine(fatal_failures_in_batch=True)): the run must stop")
      .def_prop_ro("fatal_message", [](const PyBatch& b) { return b.lease->fatal_message; })
      .def_prop_ro("dropped", &PyBatch::dropped, "samples dropped from this batch, by reason")
      .def_prop_ro(
          "drop_messages",
          [](const PyBatch& b) {
            nb::list out;
            for (const BatchLease::Drop& drop : b.lease->drop_messages) {
              out.append(nb::make_tuple(drop_reason_name(drop.reason), drop.message));
            }
            return out;
          },
          "(reason, message) of the first drops of this batch (PipelineOptions::max_drop_examples)")
      .def_prop_ro(
          "address",
          [](const PyBatch& b) { return reinterpret_cast<std::uintptr_t>(b.lease->data); },
          "address of the batch buffer (for zero-copy checks)")
      .def("torch", &PyBatch::views<nb::pytorch>, nb::arg("bf16_as_uint16") = false,
           "dict of torch tensors viewing the buffer (no copy)")
      .def(
          "numpy", [](const PyBatch& b) { return b.views<nb::numpy>(true); },
          "dict of numpy arrays viewing the buffer (bf16 as uint16 bits)");

  nb::class_<PyEngine>(m, "Engine",
                       "The fetch/assemble/deliver pipeline over one dataset and cache.",
                       nb::is_weak_referenceable())
      .def(
          "__init__",
          [](PyEngine* self, const std::string& data_path, const std::string& hidden_states_path,
             std::int64_t total_seq_len, std::int64_t hidden_size, std::int64_t num_target_layers,
             const std::string& dtype, const std::string& preprocess, const std::string& noise,
             double noise_std, std::uint64_t seed, bool apply_noise, const std::string& on_missing,
             int num_threads, int prefetch, bool in_order, bool pin_memory, double lock_timeout,
             std::int64_t chunk_bytes, const PySampleSource* source, bool fatal_failures_in_batch,
             const std::string& fp8_dequantize) {
            new (self) PyEngine(make_engine(
                source != nullptr ? source->source : nullptr, data_path, hidden_states_path,
                total_seq_len, hidden_size, num_target_layers, dtype, preprocess, noise, noise_std,
                seed, apply_noise, on_missing, num_threads, prefetch, in_order, pin_memory,
                lock_timeout, chunk_bytes, fatal_failures_in_batch, fp8_dequantize));
          },
          nb::arg("data_path"), nb::arg("hidden_states_path"), nb::arg("total_seq_len"),
          nb::arg("hidden_size"), nb::arg("num_target_layers") = 3,
          nb::arg("hidden_states_dtype") = "bfloat16", nb::arg("preprocess") = "none",
          nb::arg("noise") = "uniform", nb::arg("noise_std") = 0.0, nb::arg("seed") = 0,
          nb::arg("apply_noise") = false, nb::arg("on_missing") = "skip",
          nb::arg("num_threads") = 2, nb::arg("prefetch") = 4, nb::arg("in_order") = true,
          nb::arg("pin_memory") = true, nb::arg("lock_timeout") = 10.0, nb::arg("chunk_bytes") = 0,
          nb::arg("source").none() = nb::none(), nb::arg("fatal_failures_in_batch") = false,
          nb::arg("fp8_dequantize") = "bfloat16")
      .def("start", &PyEngine::start, nb::arg("epoch"), nb::arg("indices"), nb::arg("batches"),
           "start delivering `batches` (arrays of global rows) with their plan `indices`")
      .def("next", &PyEngine::next, "the next batch, or None at the end of the epoch")
      .def("stop",
           [](PyEngine& e) {
             nb::gil_scoped_release release;
             e.pipeline->stop();
           })
      .def("metrics", &PyEngine::metrics)
      .def_prop_ro("batch_bytes",
                   [](const PyEngine& e) { return e.pipeline->layout().total_bytes; })
      .def_prop_ro("pool_bytes", [](const PyEngine& e) { return e.pipeline->pool_bytes(); })
      .def_prop_ro("num_rows", [](const PyEngine& e) { return e.dataset->num_rows(); });

  m.def("pinning_support", [] {
    const PinningSupport support = pinning_support();
    return std::make_pair(support.available, support.detail);
  });
}

const BindingRegistration registration(50, init_engine);

}  // namespace
}  // namespace draftfeed::python
