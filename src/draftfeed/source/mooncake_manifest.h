// hs-connectors' Mooncake transfer manifest (hs-connectors 0.9.0, `mooncake_store.py`): what a vLLM
// server with `MooncakeHiddenStatesConnector` answers as `kv_transfer_params`, and how the one
// object it puts into the store under `handle` is laid out.
//
//   {"handle": KEY, "version": 1,
//    "tensors": {"hidden_states": {"shape": [T, L, H], "dtype": "torch.bfloat16",
//                                  "nbytes": N, "offset": 0},
//                "token_ids": {"shape": [T], "dtype": "torch.int64", "nbytes": 8T,
//                              "offset": align64(N)}},
//    "metadata": {"num_tokens": T, "total_aligned_bytes": S, "extract_mode": "prompt_only"}}
//
// The object is exactly S bytes: the tensors' bytes at their offsets, each offset a multiple of 64.
// A producer that failed puts `KEY:error` instead, a JSON object {"error": TEXT} (its error
// marker). hs-connectors has no checksum over the bytes: the checks a consumer can make are the
// manifest's own (version, dtypes, nbytes = shape x element size, tensors inside the object), the
// object's size against S, and then the values against the dataset row (token ids, finiteness).
//
// parse_mooncake_manifest checks everything that does not need the object: the version (1, as the
// consumer's hs-connectors refuses any other), both tensors present with known torch dtypes,
// integer shapes, nbytes equal to the shape's elements x the dtype's size, offset + nbytes within
// total_aligned_bytes, no two tensors overlapping. Untrusted input (a server's answer): every
// number is range-checked before it is used; never a crash (fuzzed: tests/fuzz).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

inline constexpr int kMooncakeManifestVersion = 1;  // hs-connectors' VERSION
inline constexpr std::string_view kMooncakeErrorSuffix = ":error";

struct MooncakeTensorSpec {
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;  // in the object
  std::uint64_t nbytes = 0;
};

struct MooncakeManifest {
  std::string handle;  // the store key
  MooncakeTensorSpec hidden_states;
  MooncakeTensorSpec token_ids;
  std::uint64_t total_bytes = 0;  // metadata.total_aligned_bytes: the object's size

  std::string error_key() const { return handle + std::string(kMooncakeErrorSuffix); }
};

// kFormat naming the handle (when there is one) and what is wrong; kUnsupported for a manifest
// version other than 1 or a dtype torch has no name for.
Result<MooncakeManifest> parse_mooncake_manifest(std::string_view json);

// The producer's message in an error marker's bytes ({"error": TEXT}), or what is wrong with them,
// both as hs-connectors words them (the key named).
std::string mooncake_error_marker_text(const std::string& error_key, std::string_view bytes);

}  // namespace draftfeed
