// libFuzzer target for hs-connectors' Mooncake transfer manifest and its error marker
// (source/mooncake_manifest.h): any bytes as a server's kv_transfer_params or as a producer's
// `<key>:error` object give a manifest or an error, never a crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "draftfeed/source/mooncake_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const auto manifest = draftfeed::parse_mooncake_manifest(body);
  if (manifest.ok()) {
    // What the transfer then relies on: both tensors inside the object.
    const auto& m = manifest.value();
    if (m.hidden_states.offset + m.hidden_states.nbytes > m.total_bytes ||
        m.token_ids.offset + m.token_ids.nbytes > m.total_bytes) {
      __builtin_trap();
    }
  }
  (void)draftfeed::mooncake_error_marker_text("key:error", body);
  return 0;
}
