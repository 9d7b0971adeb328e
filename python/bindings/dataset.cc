// Python bindings of the token dataset:
//   draftfeed.open_dataset(path) -> TokenDataset                      (GIL released while opening)
//   TokenDataset: len(), num_rows, folder, columns {name: type}, shards [paths], total_tokens,
//                 has_loss_mask, seq_lens() -> int64 array, row(i) / ds[i] -> {"input_ids",
//                 "loss_mask"}, input_ids(i), loss_mask(i), split(train_ratio) -> (train, val),
//                 has_messages, messages_json(i) -> str (the row's `messages` as JSON text)
//   DatasetSplit: len(), num_rows, begin, end, dataset, seq_lens(), row(local_i), global_row(i)
//   draftfeed.DatasetWriter(path, input_ids_int32=False, num_shards=0, total_rows=-1,
//                           rows_per_batch=1000, max_shard_bytes=500 MB, format_type="torch")
//       .add_row(input_ids, loss_mask), .finish() -> dict, .rows
//   draftfeed.write_synthetic_dataset(path, rows, seed=0, min_len=32, max_len=512, vocab=32000,
//                                     num_shards=0, int32=False) -> dict
//   draftfeed.synthetic_row(row, seed=0, min_len=32, max_len=512, vocab=32000) -> (ids, mask)
// and, under draftfeed._core only, `_write_arrow_stream` (raw IPC batches, for reader tests).
// A row's arrays are read-only copies in the stored integer dtype, read out of the mapped shards
// under the fault guard (a shard truncated by another process is an OSError naming it, never a
// SIGBUS); seq_lens() is a read-only view of the dataset's own array, whose owner holds the
// dataset. Row indices behave like Python's: negatives count from the end, anything
// outside raises IndexError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "draftfeed/common/fault_guard.h"
#include "draftfeed/common/stats_tree.h"
#include "draftfeed/dataset/arrow_ipc_writer.h"
#include "draftfeed/dataset/dataset_writer.h"
#include "draftfeed/dataset/synthetic.h"
#include "draftfeed/dataset/token_dataset.h"
#include "stats_dict.h"

namespace draftfeed::python {

namespace {

using namespace nb::literals;

using ReadOnlyArray = nb::ndarray<nb::numpy, nb::ro, nb::ndim<1>>;
using Int64Array = nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>;
using Int64Input = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using DatasetPtr = std::shared_ptr<const TokenDataset>;

struct PyTokenDataset {
  DatasetPtr dataset;
};

struct PyDatasetSplit {
  DatasetSplit split;
};

// A capsule that keeps the dataset (and so its mapped shards) alive while an array uses it.
nb::capsule owner_of(const DatasetPtr& dataset) {
  return nb::capsule(new DatasetPtr(dataset),
                     [](void* p) noexcept { delete static_cast<DatasetPtr*>(p); });
}

// A row's values as a read-only array of their stored integer type, copied out of the mapped
// shard under the fault guard: a view into the mapping would let Python read it after another
// process truncated the shard, and die of SIGBUS in numpy. A shard that shrank is an OSError
// naming the shard and the row. (A row is a few KB; the batches never come this way.)
ReadOnlyArray row_array(const IntArrayView& view, std::int64_t row, const char* column) {
  static const std::uint8_t kEmpty[8] = {};
  auto copy = std::make_unique<std::vector<std::uint8_t>>(view.size_bytes());
  if (!guarded_copy(copy->data(), view.data, copy->size())) {
    throw unreadable_row(view, row, column);
  }
  const nb::dlpack::dtype dtype{
      static_cast<std::uint8_t>(view.is_signed ? nb::dlpack::dtype_code::Int
                                               : nb::dlpack::dtype_code::UInt),
      static_cast<std::uint8_t>(view.byte_width * 8), 1};
  const std::size_t shape[1] = {static_cast<std::size_t>(view.length)};
  const std::uint8_t* data = copy->empty() ? kEmpty : copy->data();
  nb::capsule owner(copy.release(),
                    [](void* p) noexcept { delete static_cast<std::vector<std::uint8_t>*>(p); });
  return ReadOnlyArray(data, 1, shape, owner, nullptr, dtype);
}

ReadOnlyArray seq_lens_array(std::span<const std::int64_t> lens, const DatasetPtr& dataset) {
  static const std::int64_t kEmpty[1] = {};
  const std::size_t shape[1] = {lens.size()};
  return ReadOnlyArray(lens.empty() ? kEmpty : lens.data(), 1, shape, owner_of(dataset), nullptr,
                       nb::dtype<std::int64_t>());
}

// Python's index rules over [0, n).
std::int64_t python_index(std::int64_t i, std::int64_t n, const char* what) {
  const std::int64_t original = i;
  if (i < 0) i += n;
  if (i < 0 || i >= n) {
    throw nb::index_error((std::string(what) + " index " + std::to_string(original) +
                           " is out of range for " + std::to_string(n) + " rows")
                              .c_str());
  }
  return i;
}

nb::dict row_dict(const DatasetPtr& dataset, std::int64_t row) {
  nb::dict out;
  out["input_ids"] = row_array(dataset->input_ids(row), row, "input_ids");
  if (dataset->has_loss_mask()) {
    out["loss_mask"] = row_array(dataset->loss_mask(row), row, "loss_mask");
  }
  return out;
}

Int64Array owned_int64(const std::vector<std::int64_t>& values) {
  auto* copy = new std::vector<std::int64_t>(values);
  nb::capsule owner(copy,
                    [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  return Int64Array(copy->data(), {copy->size()}, owner);
}

SyntheticOptions synthetic_options(std::int64_t rows, std::uint64_t seed, std::int64_t min_len,
                                   std::int64_t max_len, std::int64_t vocab) {
  SyntheticOptions options{rows, seed, min_len, max_len, vocab};
  validate(options);
  return options;
}

void bind_dataset(nb::module_& m) {
  nb::class_<PyTokenDataset>(m, "TokenDataset",
                             "A Hugging Face save_to_disk folder read through memory maps.")
      .def("__len__", [](const PyTokenDataset& d) { return d.dataset->num_rows(); })
      .def_prop_ro("num_rows", [](const PyTokenDataset& d) { return d.dataset->num_rows(); })
      .def_prop_ro("folder", [](const PyTokenDataset& d) { return d.dataset->folder(); })
      .def_prop_ro("shards", [](const PyTokenDataset& d) { return d.dataset->shard_paths(); })
      .def_prop_ro("total_tokens",
                   [](const PyTokenDataset& d) { return d.dataset->total_tokens(); })
      .def_prop_ro("has_loss_mask",
                   [](const PyTokenDataset& d) { return d.dataset->has_loss_mask(); })
      .def_prop_ro(
          "columns",
          [](const PyTokenDataset& d) {
            nb::dict columns;
            for (const auto& c : d.dataset->columns()) columns[c.name.c_str()] = c.type;
            return columns;
          },
          "Every column's name and Arrow type text, in schema order.")
      .def(
          "seq_lens",
          [](const PyTokenDataset& d) { return seq_lens_array(d.dataset->seq_lens(), d.dataset); },
          "Every row's length (the seq_len column, else input_ids lengths): a read-only int64 "
          "view of the dataset's own array.")
      .def(
          "row",
          [](const PyTokenDataset& d, std::int64_t i) {
            return row_dict(d.dataset, python_index(i, d.dataset->num_rows(), "row"));
          },
          "i"_a,
          "The row's input_ids and loss_mask as read-only arrays of their stored dtype (copies: "
          "OSError naming the shard when it shrank under the reader).")
      .def("__getitem__",
           [](const PyTokenDataset& d, std::int64_t i) {
             return row_dict(d.dataset, python_index(i, d.dataset->num_rows(), "row"));
           })
      .def(
          "input_ids",
          [](const PyTokenDataset& d, std::int64_t i) {
            const std::int64_t row = python_index(i, d.dataset->num_rows(), "row");
            return row_array(d.dataset->input_ids(row), row, "input_ids");
          },
          "i"_a)
      .def(
          "loss_mask",
          [](const PyTokenDataset& d, std::int64_t i) {
            const std::int64_t row = python_index(i, d.dataset->num_rows(), "row");
            return row_array(d.dataset->loss_mask(row), row, "loss_mask");
          },
          "i"_a)
      .def_prop_ro("has_messages",
                   [](const PyTokenDataset& d) { return d.dataset->has_messages(); })
      .def(
          "messages_json",
          [](const PyTokenDataset& d, std::int64_t i) {
            const std::int64_t row = python_index(i, d.dataset->num_rows(), "row");
            nb::gil_scoped_release release;
            return d.dataset->messages_json(row).value();
          },
          "i"_a,
          "The row's `messages` column as JSON text, the same value as "
          "`json.dumps(load_from_disk(folder)[i][\"messages\"])`. FormatError for corrupt data "
          "or a type with no JSON form (binary, dictionary, ...), ValueError without the column.")
      .def(
          "split",
          [](const PyTokenDataset& d, double train_ratio) {
            auto [train, val] = split_train_val(d.dataset, train_ratio);
            return std::make_pair(PyDatasetSplit{std::move(train)}, PyDatasetSplit{std::move(val)});
          },
          "train_ratio"_a,
          "(train, val): rows [0, int(n * train_ratio)) and the rest; ValueError if either is "
          "empty.")
      .def("__repr__", [](const PyTokenDataset& d) {
        return "TokenDataset(folder='" + d.dataset->folder() +
               "', num_rows=" + std::to_string(d.dataset->num_rows()) + ")";
      });

  nb::class_<PyDatasetSplit>(m, "DatasetSplit", "A contiguous range of a dataset's rows.")
      .def("__len__", [](const PyDatasetSplit& s) { return s.split.num_rows(); })
      .def_prop_ro("num_rows", [](const PyDatasetSplit& s) { return s.split.num_rows(); })
      .def_prop_ro("begin", [](const PyDatasetSplit& s) { return s.split.begin; })
      .def_prop_ro("end", [](const PyDatasetSplit& s) { return s.split.end; })
      .def_prop_ro("dataset",
                   [](const PyDatasetSplit& s) { return PyTokenDataset{s.split.dataset}; })
      .def("seq_lens",
           [](const PyDatasetSplit& s) {
             return seq_lens_array(s.split.seq_lens(), s.split.dataset);
           })
      .def(
          "global_row",
          [](const PyDatasetSplit& s, std::int64_t i) {
            return s.split.global_row(python_index(i, s.split.num_rows(), "split row"));
          },
          "i"_a, "The dataset row of this split's row i (hidden-state files use this index).")
      .def(
          "row",
          [](const PyDatasetSplit& s, std::int64_t i) {
            return row_dict(s.split.dataset,
                            s.split.global_row(python_index(i, s.split.num_rows(), "split row")));
          },
          "i"_a)
      .def("__getitem__",
           [](const PyDatasetSplit& s, std::int64_t i) {
             return row_dict(s.split.dataset,
                             s.split.global_row(python_index(i, s.split.num_rows(), "split row")));
           })
      .def("__repr__", [](const PyDatasetSplit& s) {
        return "DatasetSplit(begin=" + std::to_string(s.split.begin) +
               ", end=" + std::to_string(s.split.end) + ")";
      });

  m.def(
      "open_dataset",
      [](const std::string& path) {
        DatasetPtr dataset;
        {
          nb::gil_scoped_release release;
          dataset = TokenDataset::open(path);
        }
        return PyTokenDataset{std::move(dataset)};
      },
      "path"_a, "Opens a datasets save_to_disk folder (memory-mapped, zero copy).");
}

void bind_writer(nb::module_& m) {
  nb::class_<DatasetWriter>(m, "DatasetWriter",
                            "Streams rows into a save_to_disk folder that datasets can load.")
      .def(
          "__init__",
          [](DatasetWriter* self, const std::string& path, bool input_ids_int32,
             std::int64_t num_shards, std::int64_t total_rows, std::int64_t rows_per_batch,
             std::int64_t max_shard_bytes, const std::string& format_type) {
            DatasetWriterOptions options;
            options.input_ids_int32 = input_ids_int32;
            options.num_shards = num_shards;
            options.total_rows = total_rows;
            options.rows_per_batch = rows_per_batch;
            options.max_shard_bytes = max_shard_bytes;
            options.format_type = format_type;
            new (self) DatasetWriter(path, options);
          },
          "path"_a, "input_ids_int32"_a = false, "num_shards"_a = 0, "total_rows"_a = -1,
          "rows_per_batch"_a = 1000, "max_shard_bytes"_a = 500LL << 20, "format_type"_a = "torch")
      .def(
          "add_row",
          [](DatasetWriter& w, const Int64Input& ids, const Int64Input& mask) {
            w.add_row({ids.data(), ids.shape(0)}, {mask.data(), mask.shape(0)});
          },
          "input_ids"_a, "loss_mask"_a)
      .def(
          "add_row",
          [](DatasetWriter& w, const std::vector<std::int64_t>& ids,
             const std::vector<std::int64_t>& mask) { w.add_row(ids, mask); },
          "input_ids"_a, "loss_mask"_a)
      .def("finish",
           [](DatasetWriter& w) {
             DatasetWriteSummary summary;
             {
               nb::gil_scoped_release release;
               summary = w.finish();
             }
             return stats_dict(stats_tree(summary));
           })
      .def_prop_ro("rows", &DatasetWriter::rows);

  m.def(
      "write_synthetic_dataset",
      [](const std::string& path, std::int64_t rows, std::uint64_t seed, std::int64_t min_len,
         std::int64_t max_len, std::int64_t vocab, std::int64_t num_shards, bool int32) {
        const SyntheticOptions options = synthetic_options(rows, seed, min_len, max_len, vocab);
        DatasetWriterOptions writer;
        writer.num_shards = num_shards;
        writer.input_ids_int32 = int32;
        DatasetWriteSummary summary;
        {
          nb::gil_scoped_release release;
          summary = write_synthetic_dataset(path, options, writer);
        }
        return stats_dict(stats_tree(summary));
      },
      "path"_a, "rows"_a, "seed"_a = 0, "min_len"_a = 32, "max_len"_a = 512, "vocab"_a = 32000,
      "num_shards"_a = 0, "int32"_a = false,
      "Writes rows [0, rows) of the deterministic synthetic dataset (see synthetic.h).");

  m.def(
      "synthetic_row",
      [](std::int64_t row, std::uint64_t seed, std::int64_t min_len, std::int64_t max_len,
         std::int64_t vocab) {
        const SyntheticOptions options = synthetic_options(row + 1, seed, min_len, max_len, vocab);
        std::vector<std::int64_t> ids, mask;
        synthetic_row(options, row, &ids, &mask);
        return std::make_pair(owned_int64(ids), owned_int64(mask));
      },
      "row"_a, "seed"_a = 0, "min_len"_a = 32, "max_len"_a = 512, "vocab"_a = 32000,
      "(input_ids, loss_mask) of one synthetic row, computed without a file.");
}

// (name, is_list, large_list, bit_width, is_signed)
using ColumnTuple = std::tuple<std::string, bool, bool, int, bool>;
// (length, [(node length, null count)], [buffer bytes])
using BatchTuple = std::tuple<std::int64_t, std::vector<std::pair<std::int64_t, std::int64_t>>,
                              std::vector<nb::bytes>>;

// Writes an Arrow IPC stream from raw nodes and buffers, so tests can build layouts pyarrow never
// writes (list offsets that do not start at 0, validity buffers with no nulls) and read them back
// with pyarrow as the oracle.
void write_arrow_stream(const std::string& path, const std::vector<ColumnTuple>& column_tuples,
                        const std::vector<BatchTuple>& batches) {
  std::vector<arrow::WriteColumn> columns;
  columns.reserve(column_tuples.size());
  for (const auto& [name, is_list, large_list, bit_width, is_signed] : column_tuples) {
    columns.push_back({name, is_list, large_list, bit_width, is_signed});
  }
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw Error(ErrorKind::kIo, path + ": cannot create");
  try {
    arrow::IpcStreamWriter writer(
        [&](std::span<const std::uint8_t> bytes) {
          std::fwrite(bytes.data(), 1, bytes.size(), file);
        },
        columns);
    for (const auto& [length, node_pairs, buffer_bytes] : batches) {
      std::vector<arrow::WriteNode> nodes;
      for (const auto& [node_length, nulls] : node_pairs) nodes.push_back({node_length, nulls});
      std::vector<std::span<const std::uint8_t>> buffers;
      for (const auto& bytes : buffer_bytes) {
        buffers.emplace_back(static_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      }
      writer.write_batch(length, nodes, buffers);
    }
    writer.close();
  } catch (...) {
    std::fclose(file);
    throw;
  }
  if (std::fclose(file) != 0) throw Error(ErrorKind::kIo, path + ": cannot write");
}

}  // namespace

void init_dataset(nb::module_& m) {
  m.def("_write_arrow_stream", &write_arrow_stream, "path"_a, "columns"_a, "batches"_a);
  bind_dataset(m);
  bind_writer(m);
}

}  // namespace draftfeed::python
