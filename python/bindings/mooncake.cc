// The native Mooncake transfer (source/mooncake_transfer.h) for Python, over Mooncake's own store
// client for Python, `mooncake.store.MooncakeDistributedStore` (PyPI mooncake-transfer-engine): a
// pybind11 module with no C or C++ interface installed, so its methods are called here, all the
// calls of one round under one hold of the GIL (source/mooncake_store.h). Mooncake releases the
// GIL itself while it moves bytes. No torch tensor and no Python object per tensor: per round a
// list of keys, of addresses and of sizes.
//
//   _core.MooncakeTransfer(local_hostname=..., metadata_server=..., global_segment_size=...,
//                          local_buffer_size=..., protocol=..., device_name=...,
//                          master_server_address=..., key_wait=120.0, poll_interval=0.05)
//     hs-connectors' MooncakeStoreConfig fields (the trainer's store settings); the client is
//     made and set up at the transfer's setup(), as hs-connectors' store does.
//   .stats()  its counts ("mooncake" of an OnlineSource's report)
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "draftfeed/common/error.h"
#include "draftfeed/source/mooncake_store.h"
#include "native_transfer.h"
#include "python_transfer.h"
#include "stats_dict.h"

namespace draftfeed::python {
namespace {

struct StoreSettings {
  std::string local_hostname;
  std::string metadata_server;
  std::uint64_t global_segment_size = 0;
  std::uint64_t local_buffer_size = 0;
  std::string protocol;
  std::string device_name;
  std::string master_server_address;
};

std::string python_error_text(const nb::python_error& error) {
  return std::string(nb::str(error.type().attr("__name__")).c_str()) + ": " +
         nb::str(error.value()).c_str();
}

std::vector<std::int64_t> statuses(const nb::handle& result, const char* call, std::size_t n) {
  auto out = nb::cast<std::vector<std::int64_t>>(result);
  require(out.size() == n, ErrorKind::kRuntime,
          std::string("Mooncake ") + call + " answered " + std::to_string(out.size()) +
              " statuses for " + std::to_string(n) + " keys");
  return out;
}

nb::list key_list(const std::vector<std::string>& keys) {
  nb::list list;
  for (const std::string& key : keys) list.append(nb::str(key.data(), key.size()));
  return list;
}

// The calls of one round, on the client's Python object. Only made while the GIL is held.
class PythonCalls : public MooncakeStoreCalls {
 public:
  explicit PythonCalls(const nb::object& store) : store_(store) {}

  std::vector<std::int64_t> batch_is_exist(const std::vector<std::string>& keys) override {
    return statuses(store_.attr("batch_is_exist")(key_list(keys)), "batch_is_exist", keys.size());
  }
  std::vector<std::int64_t> batch_get_into(const std::vector<std::string>& keys,
                                           const std::vector<std::uint8_t*>& buffers,
                                           const std::vector<std::uint64_t>& sizes) override {
    nb::list addresses;
    nb::list lengths;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      addresses.append(nb::int_(reinterpret_cast<std::uintptr_t>(buffers[i])));
      lengths.append(nb::int_(sizes[i]));
    }
    return statuses(store_.attr("batch_get_into")(key_list(keys), addresses, lengths),
                    "batch_get_into", keys.size());
  }
  std::int64_t get_size(const std::string& key) override {
    return nb::cast<std::int64_t>(store_.attr("get_size")(key));
  }
  std::string get(const std::string& key) override {
    nb::object bytes = store_.attr("get")(key);
    return {static_cast<const char*>(PyBytes_AsString(bytes.ptr())),
            static_cast<std::size_t>(PyBytes_Size(bytes.ptr()))};
  }
  std::vector<std::int64_t> batch_remove(const std::vector<std::string>& keys) override {
    return statuses(store_.attr("batch_remove")(key_list(keys), nb::arg("force") = true),
                    "batch_remove", keys.size());
  }
  std::int64_t register_buffer(std::uint8_t* address, std::uint64_t size) override {
    return nb::cast<std::int64_t>(
        store_.attr("register_buffer")(reinterpret_cast<std::uintptr_t>(address), size));
  }

 private:
  const nb::object& store_;
};

class PythonMooncakeClient : public MooncakeStoreClient {
 public:
  explicit PythonMooncakeClient(StoreSettings settings) : settings_(std::move(settings)) {}
  ~PythonMooncakeClient() override {
    if (!nb::is_alive()) {
      (void)store_.release();  // the interpreter is gone, and the process with it
      return;
    }
    nb::gil_scoped_acquire gil;
    if (store_.is_valid()) {
      try {
        store_.attr("close")();
      } catch (const nb::python_error&) {
        // Leaving the store: nothing left to tell.
      }
    }
    store_.reset();
  }
  PythonMooncakeClient(const PythonMooncakeClient&) = delete;
  PythonMooncakeClient& operator=(const PythonMooncakeClient&) = delete;

  void setup() override {
    nb::gil_scoped_acquire gil;
    if (store_.is_valid()) return;
    try {
      nb::object store = nb::module_::import_("mooncake.store").attr("MooncakeDistributedStore")();
      const auto status = nb::cast<std::int64_t>(store.attr("setup")(
          settings_.local_hostname, settings_.metadata_server, settings_.global_segment_size,
          settings_.local_buffer_size, settings_.protocol, settings_.device_name,
          settings_.master_server_address));
      if (status != 0) {
        throw Error(ErrorKind::kRuntime,
                    "Mooncake setup failed for key=" + settings_.local_hostname +
                        " with status=" + std::to_string(status) + " (" + description() + ")");
      }
      store_ = std::move(store);
    } catch (const nb::python_error& error) {
      throw Error(ErrorKind::kRuntime,
                  "Mooncake setup (" + description() + "): " + python_error_text(error));
    }
  }

  void round(const std::function<void(MooncakeStoreCalls&)>& calls) override {
    nb::gil_scoped_acquire gil;
    if (!store_.is_valid()) {
      throw Error(ErrorKind::kRuntime, "the Mooncake store client is not set up");
    }
    try {
      PythonCalls python(store_);
      calls(python);
    } catch (const nb::python_error& error) {
      throw Error(ErrorKind::kRuntime, "Mooncake store call: " + python_error_text(error));
    } catch (const nb::cast_error&) {
      throw Error(ErrorKind::kRuntime, "Mooncake store call: an answer of an unexpected type");
    }
  }

  std::string description() const override {
    return "master " + settings_.master_server_address + ", " + settings_.protocol +
           ", local hostname " + settings_.local_hostname;
  }

 private:
  const StoreSettings settings_;
  nb::object store_;  // the MooncakeDistributedStore, once set up; only touched with the GIL
};

}  // namespace

std::shared_ptr<HiddenStatesTransfer> transfer_of(nb::object transfer) {
  if (nb::isinstance<PyMooncakeTransfer>(transfer)) {
    return nb::cast<const PyMooncakeTransfer&>(transfer).transfer;
  }
  return make_python_transfer(std::move(transfer), /*generating=*/true);
}

void init_mooncake(nb::module_& m) {
  nb::class_<PyMooncakeTransfer>(
      m, "MooncakeTransfer",
      "hs-connectors' Mooncake transfer read natively: batch_get_into rounds into registered "
      "memory (source/mooncake_transfer.h). Pass it as OnlineSource(..., transfer=...).")
      .def(
          "__init__",
          [](PyMooncakeTransfer* self, const std::string& local_hostname,
             const std::string& metadata_server, std::uint64_t global_segment_size,
             std::uint64_t local_buffer_size, const std::string& protocol,
             const std::string& device_name, const std::string& master_server_address,
             double key_wait, double poll_interval, std::uint64_t staging_chunk_bytes) {
            MooncakeTransferOptions options;
            options.key_wait = std::chrono::duration<double>(key_wait);
            options.poll_interval = std::chrono::duration<double>(poll_interval);
            options.staging_chunk_bytes = staging_chunk_bytes;
            auto client = std::make_shared<PythonMooncakeClient>(
                StoreSettings{local_hostname, metadata_server, global_segment_size,
                              local_buffer_size, protocol, device_name, master_server_address});
            new (self) PyMooncakeTransfer{std::make_shared<MooncakeTransfer>(client, options),
                                          client->description()};
          },
          nb::kw_only(), nb::arg("local_hostname"), nb::arg("metadata_server"),
          nb::arg("global_segment_size"), nb::arg("local_buffer_size"), nb::arg("protocol"),
          nb::arg("device_name"), nb::arg("master_server_address"), nb::arg("key_wait") = 120.0,
          nb::arg("poll_interval") = 0.05,
          nb::arg("staging_chunk_bytes") = MooncakeTransferOptions{}.staging_chunk_bytes,
          "the store settings of hs-connectors' MooncakeStoreConfig; key_wait and poll_interval "
          "as its get_sample's timeout and poll_interval")
      .def("stats",
           [](const PyMooncakeTransfer& t) { return stats_dict(stats_tree(t.transfer->stats())); })
      .def_ro("description", &PyMooncakeTransfer::description);
}

}  // namespace draftfeed::python
