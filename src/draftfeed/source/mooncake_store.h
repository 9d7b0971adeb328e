// The calls the native Mooncake transfer (mooncake_transfer.h) makes on a Mooncake Store client,
// grouped in rounds: all the calls of one round run while the client is held once.
//
// Why rounds: the store client Mooncake ships for Python
// (`mooncake.store.MooncakeDistributedStore`, PyPI mooncake-transfer-engine 0.3.x) is a pybind11
// module with no C or C++ interface of its own installed, so draftfeed drives it through its Python
// methods. Holding it once per round means taking the GIL once for a whole batch of keys (the
// Python client: python/bindings/mooncake.cc), however many rows are in that batch; Mooncake
// releases the GIL itself while it transfers bytes. Tests use an in-memory store (tests/cpp).
//
// Statuses are Mooncake's: >= 0 success (bytes for a read), negative an error code
// (kMooncakeObjectNotFound for a key that does not exist, -600 for a buffer too small, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace draftfeed {

inline constexpr std::int64_t kMooncakeObjectNotFound = -704;  // Mooncake's OBJECT_NOT_FOUND
inline constexpr std::int64_t kMooncakeInvalidParams = -600;   // INVALID_PARAMS (buffer too small)
// The key exists but its put has not completed (a producer writing it now): neither readable nor
// removable yet.
inline constexpr std::int64_t kMooncakeNotReady = -703;

// One round's calls. Valid only inside MooncakeStoreClient::round's callback.
class MooncakeStoreCalls {
 public:
  virtual ~MooncakeStoreCalls() = default;
  // Per key: 1 exists, 0 does not, negative an error.
  virtual std::vector<std::int64_t> batch_is_exist(const std::vector<std::string>& keys) = 0;
  // Each object into its buffer (registered memory): bytes read, or a negative status (a buffer
  // smaller than the object is refused, not filled).
  virtual std::vector<std::int64_t> batch_get_into(const std::vector<std::string>& keys,
                                                   const std::vector<std::uint8_t*>& buffers,
                                                   const std::vector<std::uint64_t>& sizes) = 0;
  // The object's size, or a negative status.
  virtual std::int64_t get_size(const std::string& key) = 0;
  // A small object's bytes (an error marker); empty when it is missing.
  virtual std::string get(const std::string& key) = 0;
  // Removes each key even if leased (force): 0, or a negative status (kMooncakeObjectNotFound).
  virtual std::vector<std::int64_t> batch_remove(const std::vector<std::string>& keys) = 0;
  // Registers memory the client reads into: 0 or a negative status.
  virtual std::int64_t register_buffer(std::uint8_t* address, std::uint64_t size) = 0;
};

// A store client. Thread safety: round() and setup() may be called from any thread; rounds run one
// at a time.
class MooncakeStoreClient {
 public:
  virtual ~MooncakeStoreClient() = default;
  // Connects to the master (once; later calls do nothing). Throws Error naming the settings.
  virtual void setup() = 0;
  // Runs `calls` with the client held. An error of the client (a Python exception) is thrown as
  // Error(kRuntime) naming the call.
  virtual void round(const std::function<void(MooncakeStoreCalls&)>& calls) = 0;
  // What it connects to, for messages ("master 127.0.0.1:50051, tcp").
  virtual std::string description() const = 0;
};

}  // namespace draftfeed
