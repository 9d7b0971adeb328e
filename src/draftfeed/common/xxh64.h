// XXH64, the 64-bit hash of the xxHash family, written from its published specification
// (github.com/Cyan4973/xxHash, doc/xxhash_spec.md): the per-sample checksum of packed caches
// (pack/pack_manifest.h) and of a compressed sample's decoded bytes (pack/plane_codec.h). Not
// cryptographic: it finds torn writes, bit rot and truncation, not a forger.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace draftfeed {

std::uint64_t xxh64(std::span<const std::uint8_t> bytes, std::uint64_t seed = 0);

// The hash as 16 lowercase hex digits (how the manifest stores it: JSON numbers above 2^53 do not
// survive every reader).
std::string xxh64_hex(std::uint64_t hash);

}  // namespace draftfeed
