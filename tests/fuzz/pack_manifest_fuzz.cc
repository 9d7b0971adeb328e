// libFuzzer target for the packed cache's manifest parser (pack/pack_manifest.h). Any input must
// be refused with a message or give a manifest whose ranges are inside its shards and whose rows
// are unique; an accepted manifest must survive a write/re-read round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <unordered_set>

#include "draftfeed/pack/pack_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace draftfeed;
  auto manifest = parse_pack_manifest(std::span<const std::uint8_t>(data, size), "fuzz");
  if (!manifest.ok()) {
    if (manifest.error().what()[0] == '\0') std::abort();  // every refusal says why
    return 0;
  }
  std::unordered_set<std::int64_t> rows;
  for (const PackEntry& e : manifest->samples) {
    if (e.shard >= manifest->shards.size()) std::abort();
    if (e.offset + e.length > manifest->shards[e.shard].bytes) std::abort();
    if (!rows.insert(e.row).second) std::abort();
    if (!is_pack_shard_name(manifest->shards[e.shard].file)) std::abort();
  }
  const std::string text = pack_manifest_json(manifest.value());
  auto again =
      parse_pack_manifest(std::span<const std::uint8_t>(
                              reinterpret_cast<const std::uint8_t*>(text.data()), text.size()),
                          "fuzz-rewritten");
  if (!again.ok() || again->samples.size() != manifest->samples.size() ||
      again->shards.size() != manifest->shards.size() || again->codec != manifest->codec) {
    std::abort();
  }
  for (std::size_t i = 0; i < again->samples.size(); ++i) {
    const PackEntry& a = again->samples[i];
    const PackEntry& b = manifest->samples[i];
    if (a.row != b.row || a.shard != b.shard || a.offset != b.offset || a.length != b.length ||
        a.checksum != b.checksum || a.file_bytes != b.file_bytes || a.layout != b.layout) {
      std::abort();
    }
  }
  return 0;
}
