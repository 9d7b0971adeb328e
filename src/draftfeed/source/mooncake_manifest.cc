#include "draftfeed/source/mooncake_manifest.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace draftfeed {

namespace {

using Json = nlohmann::json;

// Large enough for any real sample (2^40 bytes), small enough that shape products cannot overflow.
constexpr std::uint64_t kMaxObjectBytes = std::uint64_t{1} << 40;

Error bad(const std::string& handle, const std::string& what) {
  return Error(ErrorKind::kFormat, "Mooncake transfer manifest" +
                                       (handle.empty() ? std::string() : " for key=" + handle) +
                                       ": " + what);
}

// A JSON value as text for a message; bytes that are not UTF-8 are replaced, not thrown about.
std::string text_of(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::optional<std::uint64_t> unsigned_of(const Json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v >= 0) return static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

Result<MooncakeTensorSpec> tensor_spec(const Json& tensors, const char* name,
                                       const std::string& handle, std::uint64_t total) {
  const auto found = tensors.find(name);
  if (found == tensors.end() || !found->is_object()) {
    return bad(handle, std::string("no tensor ") + name);
  }
  const Json& spec = *found;
  const std::string where = std::string("tensor ") + name + ": ";
  MooncakeTensorSpec out;
  const auto dtype = spec.find("dtype");
  if (dtype == spec.end() || !dtype->is_string()) return bad(handle, where + "no dtype");
  const auto parsed = dtype_from_torch_name(dtype->get<std::string>());
  if (!parsed || dtype_size(*parsed) == 0) {
    return Error(ErrorKind::kUnsupported, "Mooncake transfer manifest for key=" + handle + ": " +
                                              where + "unknown dtype " + text_of(*dtype));
  }
  out.dtype = *parsed;
  const auto shape = spec.find("shape");
  if (shape == spec.end() || !shape->is_array() || shape->size() > 8) {
    return bad(handle, where + "shape is not a list of at most 8 sizes");
  }
  std::uint64_t elements = 1;
  for (const Json& dim : *shape) {
    const auto size = unsigned_of(dim);
    if (!size || *size > kMaxObjectBytes)
      return bad(handle, where + "bad shape " + text_of(*shape));
    out.shape.push_back(static_cast<std::int64_t>(*size));
    // Both factors are below 2^40 and the product is checked before the next one: no overflow.
    elements = elements * *size;
    if (elements > kMaxObjectBytes)
      return bad(handle, where + "shape " + text_of(*shape) + " too large");
  }
  const auto nbytes = spec.find("nbytes");
  const auto offset = spec.find("offset");
  const auto nbytes_value = nbytes == spec.end() ? std::nullopt : unsigned_of(*nbytes);
  const auto offset_value = offset == spec.end() ? std::nullopt : unsigned_of(*offset);
  if (!nbytes_value || !offset_value) return bad(handle, where + "no nbytes or offset");
  out.nbytes = *nbytes_value;
  out.offset = *offset_value;
  const std::uint64_t expected = elements * dtype_size(out.dtype);
  if (out.nbytes != expected || out.offset > total || out.nbytes > total - out.offset) {
    return bad(handle, where + "out of bounds: offset=" + std::to_string(out.offset) +
                           ", nbytes=" + std::to_string(out.nbytes) +
                           ", expected_nbytes=" + std::to_string(expected) +
                           ", object=" + std::to_string(total) + " bytes");
  }
  return out;
}

}  // namespace

Result<MooncakeManifest> parse_mooncake_manifest(std::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return bad("", "not a JSON object");
  MooncakeManifest out;
  const auto handle = json.find("handle");
  if (handle == json.end() || !handle->is_string() || handle->get<std::string>().empty()) {
    return bad("", "no handle");
  }
  out.handle = handle->get<std::string>();
  const auto version = json.find("version");
  // hs-connectors reads a missing version as 0.
  const std::int64_t got = version == json.end()
                               ? 0
                               : (version->is_number_integer() ? version->get<std::int64_t>() : -1);
  if (got != kMooncakeManifestVersion) {
    return Error(ErrorKind::kUnsupported,
                 "Mooncake manifest version " +
                     (version == json.end() ? std::string("0") : text_of(*version)) +
                     " for key=" + out.handle + " didn't match local version " +
                     std::to_string(kMooncakeManifestVersion));
  }
  const auto metadata = json.find("metadata");
  const auto tensors = json.find("tensors");
  if (metadata == json.end() || !metadata->is_object() || tensors == json.end() ||
      !tensors->is_object()) {
    return bad(out.handle, "no tensors or metadata");
  }
  const auto total = metadata->find("total_aligned_bytes");
  const auto total_value = total == metadata->end() ? std::nullopt : unsigned_of(*total);
  if (!total_value || *total_value > kMaxObjectBytes) {
    return bad(out.handle, "metadata.total_aligned_bytes is not a size");
  }
  out.total_bytes = *total_value;
  auto hidden = tensor_spec(*tensors, "hidden_states", out.handle, out.total_bytes);
  if (!hidden.ok()) return hidden.error();
  auto ids = tensor_spec(*tensors, "token_ids", out.handle, out.total_bytes);
  if (!ids.ok()) return ids.error();
  out.hidden_states = std::move(hidden).value();
  out.token_ids = std::move(ids).value();
  const auto& [first, second] =
      std::minmax(out.hidden_states, out.token_ids,
                  [](const auto& a, const auto& b) { return a.offset < b.offset; });
  if (first.offset + first.nbytes > second.offset && second.nbytes > 0 && first.nbytes > 0) {
    return bad(out.handle, "hidden_states and token_ids overlap in the object");
  }
  return out;
}

std::string mooncake_error_marker_text(const std::string& error_key, std::string_view bytes) {
  Json json = Json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return "Corrupt Mooncake json for key=" + error_key;
  if (!json.is_object()) return "Invalid Mooncake error marker for key=" + error_key;
  const auto error = json.find("error");
  std::string text = "unknown producer error";
  if (error != json.end()) text = error->is_string() ? error->get<std::string>() : text_of(*error);
  return "Mooncake producer error for key=" + error_key + ": " + text;
}

}  // namespace draftfeed
