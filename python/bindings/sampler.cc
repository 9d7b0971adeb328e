// Python bindings of the batch planner and of numpy's permutation:
//   draftfeed.permutation(seed, n_or_array)
//   draftfeed.plan_batches(lengths, max_len, world_size, rank, *, epoch, seed, truncate,
//                          max_batches, window_order)
//   draftfeed.plan_all_ranks(lengths, max_len, world_size, *, epoch, seed, truncate, max_batches,
//                            with_counts, window_order)
// Batches come back as numpy int64 arrays that are views of one buffer per rank (each view keeps
// the buffer alive). The GIL is released while shuffling and planning.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "draftfeed/common/error.h"
#include "draftfeed/common/stats_tree.h"
#include "draftfeed/sampler/multipack.h"
#include "draftfeed/sampler/numpy_random.h"
#include "plans.h"
#include "stats_dict.h"

namespace draftfeed::python {

namespace {

using namespace nb::literals;

using Int64Array = nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>;
using Int64Input = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A data pointer for empty arrays, so numpy never sees a null buffer.
std::int64_t kEmptyData[1] = {0};

Error invalid(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

// str(value). Takes a handle on purpose: nb::str(object) would reinterpret, not convert.
std::string text_of(nb::handle value) { return nb::cast<std::string>(nb::str(value)); }

// The value of a Python int (or numpy integer), which must be non-negative, as numpy's 32-bit seed
// words. `what` names the argument in messages.
std::vector<std::uint32_t> seed_words_of(nb::handle value, const char* what) {
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  const int sign = PyObject_RichCompareBool(index.ptr(), nb::int_(0).ptr(), Py_LT);
  if (sign < 0) throw nb::python_error();
  if (sign == 1) {
    throw invalid(std::string(what) + " must be a non-negative integer, got " + text_of(index));
  }
  const auto bits = nb::cast<std::int64_t>(index.attr("bit_length")());
  const std::int64_t num_bytes = bits == 0 ? 1 : (bits + 7) / 8;
  const nb::bytes raw = nb::cast<nb::bytes>(index.attr("to_bytes")(num_bytes, "little"));
  const auto* data = static_cast<const std::uint8_t*>(static_cast<const void*>(raw.c_str()));
  std::vector<std::uint32_t> words((static_cast<std::size_t>(num_bytes) + 3) / 4, 0);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    words[i / 4] |= static_cast<std::uint32_t>(data[i]) << (8 * (i % 4));
  }
  return words;
}

std::uint64_t seed_u64_of(nb::handle value) {
  const auto words = seed_words_of(value, "seed");
  require(words.size() <= 2, ErrorKind::kInvalidArgument,
          "seed must be below 2^64, got " + text_of(value));
  return words.size() == 2 ? (static_cast<std::uint64_t>(words[1]) << 32) | words[0] : words[0];
}

// Hands a vector to numpy without copying: the array owns it through a capsule.
Int64Array to_numpy(std::vector<std::int64_t>&& values) {
  auto* owner = new std::vector<std::int64_t>(std::move(values));
  nb::capsule capsule(owner,
                      [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  std::int64_t* data = owner->empty() ? kEmptyData : owner->data();
  return Int64Array(data, {owner->size()}, capsule);
}

PlanOptions options_of(std::int64_t max_len, int world_size, nb::handle seed, bool truncate,
                       std::optional<std::int64_t> max_batches) {
  PlanOptions options;
  options.max_len = max_len;
  options.world_size = world_size;
  options.seed = seed_u64_of(seed);
  options.truncate = truncate;
  options.max_batches = max_batches;
  return options;
}

Int64Array permutation(nb::handle seed, nb::handle items) {
  const auto words = seed_words_of(seed, "seed");
  const bool is_count = PyLong_Check(items.ptr()) ||
                        nb::isinstance(items, nb::module_::import_("numpy").attr("integer"));
  std::vector<std::int64_t> result;
  if (is_count) {
    const auto n = nb::cast<std::int64_t>(items);
    require(n >= 0, ErrorKind::kInvalidArgument,
            "permutation size must be non-negative, got " + std::to_string(n));
    nb::gil_scoped_release release;
    result = numpy_permutation(words, n);
  } else {
    const Int64Input input = int64_array_of(items, "permutation input");
    nb::gil_scoped_release release;
    result = numpy_permutation_of(words, std::span(input.data(), input.shape(0)));
  }
  return to_numpy(std::move(result));
}

// Test support: numpy's random_interval(max) for each of `maxima` in turn, from one fresh
// default_rng(seed) stream, so tests can compare the bounded draws (32- and 64-bit branches and
// the switch between them, as in a shuffle of more than 2^32 items) with numpy's legacy masked
// generator on the same PCG64.
Int64Array interval_draws(nb::handle seed, const std::vector<std::uint64_t>& maxima) {
  Pcg64 rng(seed_sequence_state(seed_words_of(seed, "seed")));
  std::vector<std::int64_t> draws(maxima.size());
  for (std::size_t i = 0; i < maxima.size(); ++i) {
    draws[i] = static_cast<std::int64_t>(rng.interval(maxima[i]));
  }
  return to_numpy(std::move(draws));
}

nb::list plan_batches(nb::handle lengths, std::int64_t max_len, int world_size, int rank,
                      std::int64_t epoch, nb::handle seed, bool truncate,
                      std::optional<std::int64_t> max_batches, nb::handle window_order) {
  const Int64Input input = int64_array_of(lengths, "lengths");
  PlanOptions options = options_of(max_len, world_size, seed, truncate, max_batches);
  nb::object numpy_argsort;
  options.window_order = window_order_of(window_order, numpy_argsort);
  RankPlan plan;
  {
    nb::gil_scoped_release release;
    plan = plan_rank(std::span(input.data(), input.shape(0)), options, rank, epoch);
  }
  return batches_to_python(std::move(plan));
}

nb::object plan_all(nb::handle lengths, std::int64_t max_len, int world_size, std::int64_t epoch,
                    nb::handle seed, bool truncate, std::optional<std::int64_t> max_batches,
                    bool with_counts, nb::handle window_order) {
  const Int64Input input = int64_array_of(lengths, "lengths");
  PlanOptions options = options_of(max_len, world_size, seed, truncate, max_batches);
  nb::object numpy_argsort;
  options.window_order = window_order_of(window_order, numpy_argsort);
  AllRanksPlan plan;
  {
    nb::gil_scoped_release release;
    plan = plan_all_ranks(std::span(input.data(), input.shape(0)), options, epoch);
  }
  nb::list ranks;
  for (auto& rank : plan.ranks) ranks.append(batches_to_python(std::move(rank)));
  if (!with_counts) return ranks;
  return nb::make_tuple(ranks, stats_dict(stats_tree(plan.counts)));
}

}  // namespace

Int64Input int64_array_of(nb::handle values, const char* what) {
  nb::module_ numpy = nb::module_::import_("numpy");
  nb::object array = numpy.attr("asarray")(values);
  const auto ndim = nb::cast<int>(array.attr("ndim"));
  require(
      ndim == 1, ErrorKind::kInvalidArgument,
      std::string(what) + " must be one-dimensional, got " + std::to_string(ndim) + " dimensions");
  const auto kind = nb::cast<std::string>(array.attr("dtype").attr("kind"));
  const auto size = nb::cast<std::int64_t>(array.attr("size"));
  require(kind == "i" || kind == "u" || size == 0, ErrorKind::kInvalidArgument,
          std::string(what) + " must hold integers, got dtype " + text_of(array.attr("dtype")));
  nb::object converted = numpy.attr("ascontiguousarray")(array, "dtype"_a = "int64");
  return nb::cast<Int64Input>(converted);
}

// One rank's batches as a list of views into one numpy array that owns the rank's buffer. Views are
// cut by numpy's own slicing, several times faster than exporting one array per batch.
nb::list batches_to_python(RankPlan&& plan) {
  const std::vector<std::int64_t> offsets = plan.batch_offsets;
  nb::object whole = nb::cast(to_numpy(std::move(plan.samples)));
  nb::list batches;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
    nb::object slice =
        nb::steal(PySlice_New(nb::int_(offsets[b]).ptr(), nb::int_(offsets[b + 1]).ptr(), nullptr));
    nb::object view = nb::steal(PyObject_GetItem(whole.ptr(), slice.ptr()));
    if (!view.is_valid()) throw nb::python_error();
    batches.append(view);
  }
  return batches;
}

// The order of ties in each batch's final window (multipack.h): "numpy" calls numpy.argsort, as the
// reference does, on the machine that runs (its tie order depends on numpy's build and the CPU);
// "native" keeps the planner's own; a callable is called as numpy.argsort would be. The planner
// runs without the GIL: the callback takes it for each window that has ties. `argsort` is borrowed
// (the caller's argument outlives the planning), so no reference count changes without the GIL.
WindowOrder window_order_of(nb::handle order, nb::object& numpy_argsort) {
  if (nb::isinstance<nb::str>(order)) {
    const auto name = nb::cast<std::string>(order);
    if (name == "native") return {};
    require(name == "numpy", ErrorKind::kInvalidArgument,
            "window_order must be 'numpy', 'native' or a callable, got '" + name + "'");
    numpy_argsort = nb::module_::import_("numpy").attr("argsort");
    order = numpy_argsort;
  }
  require(PyCallable_Check(order.ptr()) != 0, ErrorKind::kInvalidArgument,
          "window_order must be 'numpy', 'native' or a callable, got " + text_of(order));
  PyObject* argsort = order.ptr();
  return [argsort](std::span<const std::int64_t> lengths, std::span<std::int64_t> out) {
    nb::gil_scoped_acquire gil;
    nb::object window =
        nb::cast(to_numpy(std::vector<std::int64_t>(lengths.begin(), lengths.end())));
    nb::object result = nb::borrow(argsort)(window);
    const Int64Input ascending = int64_array_of(result, "window_order's result");
    require(static_cast<std::size_t>(ascending.shape(0)) == out.size(), ErrorKind::kRuntime,
            "plan: window_order gave " + std::to_string(ascending.shape(0)) + " positions for " +
                std::to_string(out.size()) + " lengths");
    std::copy(ascending.data(), ascending.data() + out.size(), out.begin());
  };
}

void init_sampler(nb::module_& m) {
  m.def("permutation", &permutation, "seed"_a, "x"_a,
        "numpy.random.default_rng(seed).permutation(x), bit for bit, as an int64 array.\n\n"
        "`x` is a size n (a permutation of arange(n)) or a 1-d integer array (a shuffled copy).\n"
        "`seed` is any non-negative integer, as numpy accepts it.");
  m.def("_numpy_interval_draws", &interval_draws, "seed"_a, "maxima"_a,
        "Test support: numpy's random_interval(max) for each max in turn, from "
        "default_rng(seed)'s PCG64 (int64 array; draws above 2^63 wrap).");
  m.def("plan_batches", &plan_batches, "lengths"_a, "max_len"_a, "world_size"_a, "rank"_a,
        nb::kw_only(), "epoch"_a = 0, "seed"_a = nb::int_(0), "truncate"_a = true,
        "max_batches"_a = nb::none(), "window_order"_a = "numpy",
        "This rank's batches for the epoch, as speculators' MultipackDistributedBatchSamplerV2\n"
        "plans them: a list of int64 arrays of positions in `lengths`, in packing order.\n"
        "`truncate=False` drops samples longer than max_len instead of clipping their length.\n"
        "`window_order`: how samples of equal length are ordered in each batch: 'numpy' (the\n"
        "reference's numpy.argsort, called once per batch that has ties), 'native' (ours, no\n"
        "Python calls; tied samples may land on other ranks than the reference's), or a\n"
        "callable with numpy.argsort's contract.");
  m.def("plan_all_ranks", &plan_all, "lengths"_a, "max_len"_a, "world_size"_a, nb::kw_only(),
        "epoch"_a = 0, "seed"_a = nb::int_(0), "truncate"_a = true, "max_batches"_a = nb::none(),
        "with_counts"_a = false, "window_order"_a = "numpy",
        "Every rank's batches for the epoch in one pass: a list (index = rank) of lists of int64\n"
        "arrays. With `with_counts=True`, returns (batches, counts) where counts is a dict with\n"
        "num_samples, num_long, dropped_long, dropped_tail, cut_by_max_batches and planned.\n"
        "`window_order` as in plan_batches.");
}

}  // namespace draftfeed::python
