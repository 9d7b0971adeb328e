// Python bindings of the engine: `_core.Loader` (the C++ Loader: a split, planned per epoch, run
// through the pipeline) hands out `_core.Batch` objects whose tensors view the batch buffer
// without copying (DLPack); `_core.LoaderOptions` are its options. The Python loader classes
// (python/draftfeed/loader.py) build on these.
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "cache_options.h"
#include "dlpack_dtype.h"
#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/cuda/device_allocator.h"
#include "draftfeed/cuda/read_fence.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/loader/loader.h"
#include "draftfeed/pipeline/host_memory.h"
#include "draftfeed/pipeline/pipeline.h"
#include "draftfeed/source/cache_source.h"
#include "options_init.h"
#include "plans.h"
#include "sample_source.h"
#include "stats_dict.h"

namespace draftfeed::python {
namespace {

// {reason name: samples dropped}.
nb::dict drop_counts(const DropCounts& counts) {
  return stats_dict(named_counts(counts, drop_reason_name));
}

// A delivered batch as Python sees it.
struct PyBatch {
  std::shared_ptr<BatchLease> lease;

  // Every tensor of the batch, in the reference's key order, as views of the batch's memory. Each
  // view holds its own slot, not the batch: the buffer returns to the pool when the batch object
  // is gone, and a tensor kept longer pins only its slot (see pipeline/buffer_pool.h).
  template <typename Framework>
  nb::dict views(bool bf16_as_uint16) const {
    nb::dict out;
    for (std::size_t s = 0; s < lease->layout->tensors.size(); ++s) {
      const TensorSlot& slot = lease->layout->tensors[s];
      auto* holder = new std::shared_ptr<SlotRegion>(lease->regions[s]);
      (*holder)->hold();
      nb::capsule owner(holder, [](void* p) noexcept {
        auto* region = static_cast<std::shared_ptr<SlotRegion>*>(p);
        (*region)->release();
        delete region;
      });
      DType dtype = slot.dtype;
      // The reference's all-padding batch has a bool loss mask (its empty sample's dtype).
      if (slot.name == "loss_mask" && lease->locally_empty) dtype = DType::kBool;
      nb::dlpack::dtype dl = dlpack_of(dtype);
      if (bf16_as_uint16 && dtype == DType::kBF16) dl = nb::dtype<std::uint16_t>();
      std::vector<std::size_t> shape(slot.shape.begin(), slot.shape.end());
      const bool on_device = lease->device >= 0;
      out[slot.name.c_str()] =
          nb::ndarray<Framework>(lease->memory[s], shape.size(), shape.data(), owner, nullptr, dl,
                                 on_device ? nb::device::cuda::value : nb::device::cpu::value,
                                 on_device ? lease->device : 0);
    }
    return out;
  }

  // Where each tensor's bytes are: (name, address, bytes), layout order. For tools and tests
  // that reach the memory without a framework (a device batch's addresses are device memory).
  nb::list tensor_memory() const {
    nb::list out;
    for (std::size_t s = 0; s < lease->layout->tensors.size(); ++s) {
      out.append(nb::make_tuple(lease->layout->tensors[s].name,
                                reinterpret_cast<std::uintptr_t>(lease->memory[s]),
                                lease->layout->tensors[s].nbytes));
    }
    return out;
  }

  nb::dict dropped() const { return drop_counts(lease->dropped); }

  // Preprocess::kCustom: each usable sample as the reference's dataset gives it to a preprocess
  // (hidden_states, input_ids, verifier_last_hidden_states, loss_mask, lengths, position_ids),
  // torch views of the batch's staging rows, in plan order. The views keep the lease alive.
  nb::list samples() const {
    require(lease->layout->spec.preprocess == Preprocess::kCustom, ErrorKind::kInvalidArgument,
            "samples(): the engine packs its batches itself (preprocess is not 'custom')");
    struct Owner {
      std::shared_ptr<BatchLease> lease;
      std::vector<std::int64_t> lengths;
    };
    auto* holder = new Owner{lease, {}};
    for (const SamplePlacement& p : lease->placement.samples) holder->lengths.push_back(p.rows);
    nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<Owner*>(p); });
    const BatchLayout& layout = *lease->layout;
    nb::list out;
    for (std::size_t k = 0; k < lease->placement.samples.size(); ++k) {
      const SamplePlacement& p = lease->placement.samples[k];
      nb::dict sample;
      auto view = [&](const char* name, std::int64_t width) {
        const TensorSlot& slot = *layout.find(name);
        const std::size_t row_bytes = static_cast<std::size_t>(width) * dtype_size(slot.dtype);
        std::vector<std::size_t> shape{static_cast<std::size_t>(p.rows)};
        if (slot.shape.size() == 3) shape.push_back(static_cast<std::size_t>(width));
        sample[name] = nb::ndarray<nb::pytorch>(slot_data(layout, lease->memory, name) +
                                                    static_cast<std::size_t>(p.dst_row) * row_bytes,
                                                shape.size(), shape.data(), owner, nullptr,
                                                dlpack_of(slot.dtype));
      };
      view("hidden_states", layout.target_row_width());
      view("input_ids", 1);
      view("verifier_last_hidden_states", layout.last_row_width());
      view("loss_mask", 1);
      const std::size_t one = 1;
      sample["lengths"] = nb::ndarray<nb::pytorch>(&holder->lengths[k], 1, &one, owner, nullptr,
                                                   nb::dtype<std::int64_t>());
      view("position_ids", 1);
      out.append(sample);
    }
    return out;
  }
};

// The reference's empty sample (speculators' create_empty_sample) for an all-failed batch under
// Preprocess::kCustom: zero rows, a bool loss mask, hidden tensors in the batch dtype.
nb::dict empty_sample(const BatchLayout& layout) {
  struct Owner {
    std::int64_t lengths[1] = {0};
    std::uint8_t nothing[8] = {};
  };
  auto* holder = new Owner;
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<Owner*>(p); });
  const nb::dlpack::dtype hidden =
      layout.spec.dtype == DType::kBF16 ? dlpack_of(DType::kBF16) : dlpack_of(DType::kF32);
  auto tensor = [&](std::vector<std::size_t> shape, nb::dlpack::dtype dtype) {
    return nb::ndarray<nb::pytorch>(holder->nothing, shape.size(), shape.data(), owner, nullptr,
                                    dtype);
  };
  nb::dict sample;
  sample["hidden_states"] =
      tensor({0, static_cast<std::size_t>(layout.target_row_width())}, hidden);
  sample["input_ids"] = tensor({0}, nb::dtype<std::int64_t>());
  sample["verifier_last_hidden_states"] =
      tensor({0, static_cast<std::size_t>(layout.last_row_width())}, hidden);
  sample["loss_mask"] = tensor({0}, nb::dtype<bool>());
  const std::size_t one = 1;
  sample["lengths"] =
      nb::ndarray<nb::pytorch>(holder->lengths, 1, &one, owner, nullptr, nb::dtype<std::int64_t>());
  sample["position_ids"] = tensor({0}, nb::dtype<std::int64_t>());
  return sample;
}

// Device memory blocks given to the device stage. The C++ object is shared with the engine (which
// gives the blocks back on its device worker) and never holds a Python reference: the Python side
// keeps the tensors that own the memory alive while `outstanding` is not 0.
struct PyDeviceMemory {
  std::shared_ptr<GivenDeviceMemory> memory;
};

struct PyLoader {
  std::shared_ptr<Loader> loader;

  PyLoader() = default;
  PyLoader(PyLoader&&) = default;
  // Workers may need the GIL (a Python transfer): stop them with it released.
  ~PyLoader() {
    if (loader) {
      nb::gil_scoped_release release;
      loader.reset();
    }
  }

  nb::list plan(std::int64_t epoch, nb::handle window_order) {
    nb::object numpy_argsort;
    const WindowOrder order = window_order_of(window_order, numpy_argsort);
    RankPlan plan;
    {
      nb::gil_scoped_release release;
      plan = loader->plan(epoch, order);
    }
    return batches_to_python(std::move(plan));
  }

  // begin_epoch over `batches` (arrays of split-local sample indices: a trainer's slice of the
  // plan) or, with None, the plan itself.
  std::vector<std::int64_t> begin_epoch(nb::handle batches, bool fetch) {
    std::optional<std::vector<std::vector<std::int64_t>>> local;
    if (!batches.is_none()) {
      local.emplace();
      for (nb::handle batch : batches) {
        const Int64Input ids = int64_array_of(batch, "batch");
        local->emplace_back(ids.data(), ids.data() + ids.shape(0));
      }
    }
    nb::gil_scoped_release release;
    return loader->begin_epoch(local ? &*local : nullptr, fetch);
  }

  nb::dict state() const {
    LoaderState state;
    {
      nb::gil_scoped_release release;
      state = loader->state();
    }
    nb::dict out;
    out["epoch"] = state.epoch;
    out["delivered"] = state.delivered;
    out["num_batches"] = state.num_batches;
    out["seed"] = *state.seed;
    out["world_size"] = *state.world_size;
    out["rank"] = *state.rank;
    out["total_seq_len"] = *state.total_seq_len;
    out["split"] = *state.split;
    if (state.train_ratio) out["train_ratio"] = *state.train_ratio;
    out["dataset_rows"] = *state.dataset_rows;
    out["truncate"] = *state.truncate;
    return out;
  }

  // A state_dict as state() makes it (JSON-serialisable: plain ints, floats, strings, bools); the
  // keys beside epoch and delivered are checked when present, a refusal naming a key as `names`
  // spells it (the drop-in's reference names).
  void restore(const nb::dict& saved, const StateKeyNames& names) {
    LoaderState state;
    state.epoch = nb::cast<std::int64_t>(saved["epoch"]);
    for (nb::handle position : saved["delivered"]) {
      state.delivered.push_back(nb::cast<std::int64_t>(position));
    }
    auto optional = [&](const char* key, auto& field) {
      if (saved.contains(key)) {
        field = nb::cast<typename std::remove_reference_t<decltype(field)>::value_type>(saved[key]);
      }
    };
    optional("seed", state.seed);
    optional("world_size", state.world_size);
    optional("rank", state.rank);
    optional("total_seq_len", state.total_seq_len);
    optional("split", state.split);
    optional("train_ratio", state.train_ratio);
    optional("dataset_rows", state.dataset_rows);
    optional("truncate", state.truncate);
    loader->restore(state, names);
  }

  std::optional<PyBatch> next(std::uintptr_t consumer_stream) {
    std::shared_ptr<BatchLease> lease;
    {
      nb::gil_scoped_release release;
      lease = loader->next(cuda_stream_from_handle(consumer_stream));
    }
    if (!lease) return std::nullopt;
    return PyBatch{std::move(lease)};
  }

  nb::dict metrics() const { return stats_dict(stats_tree(loader->metrics())); }
};

// The loader's options under the Python Loader's flat names: the one list of them in Python
// (what Python sets is what C++ reads; conversions happen here, once). Built from keywords
// (options_init.h).
void bind_loader_options(nb::module_& m) {
  using O = LoaderOptions;
  nb::class_<O> cls(m, "LoaderOptions",
                    "Options of one loader (C++ LoaderOptions), under the Python Loader's names; "
                    "LoaderOptions(name=value, ...) sets them by name, the others keep C++'s "
                    "defaults. validate() checks them; validation() gives the validation loader's "
                    "options of a training run.");
  cls.def("__init__", &init_from_kwargs<O>)
      .def("validate", &O::validate, "raises ValueError naming the first bad field")
      .def("validation", &O::validation)
      .def_prop_rw(
          "data_path", [](const O& o) { return o.data_path; },
          [](O& o, const std::filesystem::path& v) { o.data_path = v.string(); },
          "a save_to_disk folder")
      .def_prop_rw(
          "split", [](const O& o) { return std::string(split_name(o.split)); },
          [](O& o, const std::string& v) { o.split = parse_split(v); }, "'train', 'val' or 'all'")
      .def_rw("train_ratio", &O::train_ratio)
      .def_rw("rank", &O::rank, "data-parallel rank")
      .def_prop_rw(
          "world_size", [](const O& o) { return o.plan.world_size; },
          [](O& o, int v) { o.plan.world_size = v; }, "data-parallel ranks")
      .def_prop_rw(
          "total_seq_len", [](const O& o) { return o.batch.max_len; },
          [](O& o, std::int64_t v) { o.batch.max_len = v; })
      .def_prop_rw(
          "hidden_size", [](const O& o) { return o.batch.hidden_size; },
          [](O& o, std::int64_t v) { o.batch.hidden_size = v; })
      .def_prop_rw(
          "num_target_layers", [](const O& o) { return o.batch.num_target_layers; },
          [](O& o, std::int64_t v) { o.batch.num_target_layers = v; })
      .def_prop_rw(
          "hidden_states_dtype",
          [](const O& o) { return std::string(torch_dtype_name(o.batch.dtype)); },
          [](O& o, nb::handle v) {
            o.batch.dtype = parse_torch_dtype(nb::str(v).c_str(), "hidden_states_dtype");
          },
          "'bfloat16' or 'float32' (or the torch dtype)")
      .def_prop_rw(
          "preprocess", [](const O& o) { return std::string(preprocess_name(o.batch.preprocess)); },
          [](O& o, const std::string& v) { o.batch.preprocess = parse_preprocess(v); },
          "'none', 'eagle3' (or 'peagle'), 'mtp', or 'custom' (a callable run in Python)")
      .def_prop_rw(
          "noise", [](const O& o) { return std::string(noise_kind_name(o.batch.noise.kind)); },
          [](O& o, const std::string& v) { o.batch.noise.kind = parse_noise_kind(v); },
          "'uniform', 'gaussian' or 'none' (training split only)")
      .def_prop_rw(
          "noise_std", [](const O& o) { return o.batch.noise.std; },
          [](O& o, double v) { o.batch.noise.std = v; }, "0: no noise")
      .def_prop_rw(
          "seed", [](const O& o) { return o.batch.noise.seed; },
          [](O& o, std::uint64_t v) { o.batch.noise.seed = v; }, "of the plan and the noise")
      .def_prop_rw(
          "truncate", [](const O& o) { return o.plan.truncate; },
          [](O& o, bool v) { o.plan.truncate = v; }, "clip long samples (else drop them)")
      .def_prop_rw(
          "max_batches", [](const O& o) { return o.plan.max_batches; },
          [](O& o, std::optional<std::int64_t> v) { o.plan.max_batches = v; },
          nb::arg("value").none())
      .def_prop_rw(
          "num_threads", [](const O& o) { return o.pipeline.num_threads; },
          [](O& o, int v) { o.pipeline.num_threads = v; },
          "fetch and assembly threads (an online source's requests get their own)")
      .def_prop_rw(
          "prefetch", [](const O& o) { return o.pipeline.buffers; },
          [](O& o, int v) { o.pipeline.buffers = v; }, "batch buffers")
      .def_prop_rw(
          "read_ahead_bytes", [](const O& o) { return o.read_ahead_bytes; },
          [](O& o, std::uint64_t v) { o.read_ahead_bytes = v; },
          "what the source may hold read ahead of the batch buffers, its files read into the page "
          "cache or an online source's samples fetched (0: 4 x the batch buffers' bytes, at least "
          "256 MiB); metrics()['read_ahead_memory'] reports what it held")
      .def_prop_rw(
          "in_order", [](const O& o) { return o.pipeline.in_order; },
          [](O& o, bool v) { o.pipeline.in_order = v; })
      .def_prop_rw(
          "pin_memory", [](const O& o) { return o.pipeline.try_pin; },
          [](O& o, bool v) { o.pipeline.try_pin = v; })
      .def_prop_rw(
          "cuda_device", [](const O& o) { return o.pipeline.cuda_device; },
          [](O& o, int v) { o.pipeline.cuda_device = v; },
          "the rank's CUDA device for every CUDA call (-1: LOCAL_RANK, else 0)")
      .def_prop_rw(
          "device_stage", [](const O& o) { return o.pipeline.device_stage; },
          [](O& o, bool v) { o.pipeline.device_stage = v; },
          "deliver batches in device memory of cuda_device, copied ahead on a stream of its own")
      .def_prop_rw(
          "device_buffers", [](const O& o) { return o.pipeline.device_buffers; },
          [](O& o, int v) { o.pipeline.device_buffers = v; },
          "batches in device memory at most (the device stage)")
      .def_prop_rw(
          "chunk_bytes", [](const O& o) { return o.pipeline.chunk_bytes; },
          [](O& o, std::int64_t v) { o.pipeline.chunk_bytes = v; })
      .def_prop_rw(
          "fatal_failures_in_batch", [](const O& o) { return o.pipeline.fatal_failures_in_batch; },
          [](O& o, bool v) { o.pipeline.fatal_failures_in_batch = v; })
      .def_prop_rw(
          "source", [](const O&) { return nb::none(); },
          [](O& o, const PySampleSource* source) {
            o.source = source != nullptr ? source->source : nullptr;
          },
          nb::arg("source").none(), "where hidden states come from (write-only; None: the cache)");
  bind_cache_options(cls);
}

}  // namespace

void init_engine(nb::module_& m) {
  nb::class_<PySampleSource>(
      m, "SampleSource",
      "Where the engine gets hidden states (the cache by default; an online source from "
      "draftfeed.online). Pass one as Loader(..., source=...).")
      .def_ro("description", &PySampleSource::description)
      .def(
          "fetch_native",
          [](const PySampleSource& s, std::int64_t row, const Int64Input& ids) {
            nb::dict out;
            const FetchOutcome outcome = fetch_one(*s.source, row, ids, out);
            if (!outcome.sample) return out;
            const HiddenStatesView& hs = outcome.sample->hidden;
            const auto count = static_cast<std::size_t>(hs.tokens * hs.layers * hs.hidden);
            // The values may lie in a mapped file another process shrinks meanwhile: copied out
            // under the fault guard before anything else reads them.
            std::vector<std::uint8_t> raw(count * dtype_size(hs.dtype));
            std::vector<std::uint8_t> scales(
                hs.dtype == DType::kF8E4M3 ? static_cast<std::size_t>(hs.tokens) * 4 : 0);
            if (!guarded_copy(raw.data(), hs.data, raw.size()) ||
                !guarded_copy(scales.data(), hs.scales, scales.size())) {
              out["ok"] = false;
              out["reason"] = drop_reason_name(DropReason::kInvalid);
              out["message"] = "row " + std::to_string(row) +
                               ": the hidden states' file shrank while they were read "
                               "(truncated by another process)";
              return out;
            }
            if (hs.dtype == DType::kF8E4M3) {
              // As FP8Transfer hands it over: dequantized, in its dequantize dtype.
              const std::vector<std::uint8_t> values = dequantize_fp8_tensor(
                  raw.data(), scales.data(), hs.tokens, hs.layers * hs.hidden, hs.dequantize);
              out["dtype"] = torch_dtype_name(hs.dequantize);
              out["hidden_bytes"] =
                  nb::bytes(reinterpret_cast<const char*>(values.data()), values.size());
            } else {
              out["dtype"] = torch_dtype_name(hs.dtype);
              out["hidden_bytes"] =
                  nb::bytes(reinterpret_cast<const char*>(raw.data()), raw.size());
            }
            out["shape"] = nb::make_tuple(hs.tokens, hs.layers, hs.hidden);
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
          "a fatal generation failure (LoaderOptions.fatal_failures_in_batch): the run must stop")
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
          "device", [](const PyBatch& b) { return b.lease->device; },
          "the CUDA device the batch's memory is on (the device stage), or -1 for host memory")
      .def("tensor_memory", &PyBatch::tensor_memory,
           "[(name, address, bytes)] of every tensor, in layout order (device memory for a "
           "device batch)")
      .def_prop_ro(
          "address",
          [](const PyBatch& b) {
            return reinterpret_cast<std::uintptr_t>(b.lease->memory.front());
          },
          "address of the batch buffer (for zero-copy checks)")
      .def("torch", &PyBatch::views<nb::pytorch>, nb::arg("bf16_as_uint16") = false,
           "dict of torch tensors viewing the buffer (no copy)")
      .def("samples", &PyBatch::samples,
           "preprocess 'custom': each usable sample, unpacked, as dicts of torch views (plan "
           "order), for the user's callable; pack what it returns with pack_samples()")
      .def(
          "empty_sample", [](const PyBatch& b) { return empty_sample(*b.lease->layout); },
          "the reference's empty sample (zero rows), for a batch whose samples all failed")
      .def(
          "numpy",
          [](const PyBatch& b) {
            require(b.lease->device < 0, ErrorKind::kInvalidArgument,
                    "numpy(): the batch is in device memory (cuda:" +
                        std::to_string(b.lease->device) + "); use torch()");
            return b.views<nb::numpy>(true);
          },
          "dict of numpy arrays viewing the buffer (bf16 as uint16 bits)");

  bind_loader_options(m);
  nb::class_<PyLoader>(m, "Loader",
                       "The epoch driver (C++ Loader): one split, planned per epoch, fetched and "
                       "assembled by the pipeline.",
                       nb::is_weak_referenceable())
      .def(
          "__init__",
          [](PyLoader* self, const LoaderOptions& options) {
            new (self) PyLoader();
            self->loader = std::make_shared<Loader>(options);
          },
          nb::arg("options"))
      .def("plan", &PyLoader::plan, nb::arg("epoch"), nb::arg("window_order") = "numpy",
           "this rank's batches of the epoch (arrays of split-local sample indices)")
      .def(
          "set_epoch", [](PyLoader& l, std::int64_t epoch) { l.loader->set_epoch(epoch); },
          nb::arg("epoch"))
      .def_prop_ro("epoch", [](const PyLoader& l) { return l.loader->epoch(); })
      .def("begin_epoch", &PyLoader::begin_epoch, nb::arg("batches").none() = nb::none(),
           nb::arg("fetch") = true,
           "starts the epoch set by set_epoch over `batches` (arrays of split-local indices; "
           "None: the plan), less the batches a restored state delivered; the source learns "
           "what it will fetch; returns the positions to deliver. fetch=False: nothing is "
           "fetched (a sequence-parallel rank that is not a data rank: mark_delivered each)")
      .def(
          "mark_delivered",
          [](PyLoader& l, std::int64_t position) { l.loader->mark_delivered(position); },
          nb::arg("position"))
      .def("state", &PyLoader::state,
           "the resume state: {epoch, delivered, num_batches, seed, world_size, rank, "
           "total_seq_len, split, train_ratio (unless split is 'all'), dataset_rows, truncate}")
      .def("restore", &PyLoader::restore, nb::arg("state"), nb::arg("names") = StateKeyNames(),
           "the next begin_epoch of state['epoch'] delivers exactly the other batches; ValueError "
           "naming both values when the state was saved by a loader of another plan (another "
           "split, dataset, ranks, total_seq_len, seed or truncate rule), the key as `names` "
           "spells it")
      .def("next", &PyLoader::next, nb::arg("consumer_stream") = 0,
           "the next batch, or None at the end of the epoch; consumer_stream: the CUDA stream "
           "(cudaStream_t as an int, 0: the default stream) the consumer copies or uses the batch "
           "on, where its reads are marked when the batch is released")
      .def("stop",
           [](PyLoader& l) {
             nb::gil_scoped_release release;
             l.loader->stop();
           })
      .def(
          "close",
          [](PyLoader& l) {
            nb::gil_scoped_release release;
            l.loader->close();
          },
          "stop, and the source forgets what it read ahead for this loader alone")
      .def(
          "set_device_memory",
          [](PyLoader& l, const PyDeviceMemory* memory) {
            std::shared_ptr<DeviceAllocator> allocator;
            if (memory != nullptr) allocator = memory->memory;
            nb::gil_scoped_release release;
            l.loader->set_device_allocator(std::move(allocator));
          },
          nb::arg("memory").none(),
          "the device stage's buffers come from `memory` (None: cudaMalloc) from the next epoch on")
      .def("metrics", &PyLoader::metrics)
      .def_prop_ro("options", [](const PyLoader& l) { return l.loader->options(); })
      .def_prop_ro(
          "pinning", [](const PyLoader& l) { return l.loader->pinning_detail(); },
          "where batch buffers are: page-locked for which device through which CUDA runtime, or "
          "why they are pageable")
      .def_prop_ro(
          "cuda_device", [](const PyLoader& l) { return l.loader->cuda_device(); },
          "the CUDA device the buffers are pinned on or copied to; -1: none")
      .def_prop_ro("split_begin", [](const PyLoader& l) { return l.loader->split().begin; })
      .def_prop_ro("split_end", [](const PyLoader& l) { return l.loader->split().end; })
      .def_prop_ro("batch_bytes", [](const PyLoader& l) { return l.loader->layout().total_bytes; })
      .def_prop_ro("pool_bytes", [](const PyLoader& l) { return l.loader->pool_bytes(); })
      .def_prop_ro("num_rows", [](const PyLoader& l) { return l.loader->dataset()->num_rows(); })
      .def_prop_ro(
          "lengths",
          [](const PyLoader& l) {
            const auto lengths = l.loader->split().seq_lens();
            auto* copy = new std::vector<std::int64_t>(lengths.begin(), lengths.end());
            nb::capsule owner(
                copy, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
            static std::int64_t empty[1] = {0};
            return nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>(
                copy->empty() ? empty : copy->data(), {copy->size()}, owner);
          },
          nb::rv_policy::reference, "the split's sample lengths (the planner's), a copy")
      .def_prop_ro("columns", [](const PyLoader& l) {
        nb::list out;
        for (const ColumnInfo& column : l.loader->dataset()->columns()) out.append(column.name);
        return out;
      });

  nb::class_<PyDeviceMemory>(
      m, "DeviceMemory",
      "Device memory blocks made by the caller (torch.empty on the device) that the device stage "
      "takes its buffers from instead of cudaMalloc; the caller keeps them alive while "
      "`outstanding` is not 0. A request no free block fits goes to cudaMalloc (fallback_bytes).")
      .def(
          "__init__",
          [](PyDeviceMemory* self,
             const std::vector<std::pair<std::uintptr_t, std::size_t>>& blocks) {
            std::vector<GivenDeviceMemory::Block> given;
            given.reserve(blocks.size());
            for (const auto& [address, bytes] : blocks) given.push_back({address, bytes});
            new (self) PyDeviceMemory{
                std::make_shared<GivenDeviceMemory>(given, runtime_device_allocator())};
          },
          nb::arg("blocks"), "blocks: [(address, bytes)] of device memory on the loader's device")
      .def_prop_ro(
          "outstanding", [](const PyDeviceMemory& d) { return d.memory->outstanding(); },
          "blocks handed out to the engine now (device reads may be pending)")
      .def_prop_ro("given_bytes", [](const PyDeviceMemory& d) { return d.memory->given_bytes(); })
      .def_prop_ro(
          "fallback_bytes", [](const PyDeviceMemory& d) { return d.memory->fallback_bytes(); },
          "bytes the engine took from cudaMalloc because no block was free")
      .def_prop_ro("fallback_outstanding",
                   [](const PyDeviceMemory& d) { return d.memory->fallback_outstanding(); });

  m.def(
      "fence_counts",
      [] {
        const ReadFence::Counts counts = ReadFence::counts();
        nb::dict out;
        out["rewrites_while_read"] = counts.rewrites_while_read;
        out["checks_while_read"] = counts.checks_while_read;
        return out;
      },
      "process-wide: buffers about to be rewritten while the device's reads of them were still "
      "pending (the fence made the writer wait, or ordered the copy after them), and checks "
      "before a reuse or a free that found reads pending");

  m.def("pinning_support", [] {
    const PinningSupport support = pinning_support();
    return std::make_pair(support.available, support.detail);
  });
}

}  // namespace draftfeed::python
