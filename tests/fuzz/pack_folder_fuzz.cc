// libFuzzer target for a whole packed cache as a reader meets it (pack/packed_cache.h): a manifest,
// the shard it names (its safetensors header, its samples' own headers, the codec blobs) and every
// read a loader, verify and unpack make of each sample. The fields of the three lie together here
// (a manifest's sizes and checksums against a shard's header against a sample's own header against
// a blob's table): every sample must read, or be refused with a message, and nothing may be
// allocated past what the input holds (libFuzzer's -rss_limit_mb and -malloc_limit_mb catch that).
//
// Input: u32 little-endian manifest length, the manifest, then the shard file. The manifest names
// one shard, `shard-000000.safetensors`; the files are written to a folder of this process's own.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

#include "draftfeed/pack/packed_cache.h"

namespace {

// Never destroyed: the exit handler that removes the folder runs after static destructors would.
const std::string& folder() {
  static const std::string* const path = [] {
    auto* dir = new std::string("/tmp/draftfeed_pack_folder_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(*dir);
    std::atexit([] { std::filesystem::remove_all(folder()); });
    return dir;
  }();
  return *path;
}

void write_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void must_say_why(const draftfeed::Error& error) {
  if (error.what()[0] == '\0') std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace draftfeed;
  if (size < 4) return 0;
  std::uint32_t manifest_size = 0;
  for (int i = 0; i < 4; ++i) manifest_size |= static_cast<std::uint32_t>(data[i]) << (8 * i);
  if (manifest_size > size - 4) return 0;
  const std::span<const std::uint8_t> manifest(data + 4, manifest_size);
  const std::span<const std::uint8_t> shard(data + 4 + manifest_size, size - 4 - manifest_size);
  write_file(folder() + "/manifest.json", manifest);
  write_file(folder() + "/shard-000000.safetensors", shard);
  auto pack = PackedCache::open(folder());
  if (!pack.ok()) {
    must_say_why(pack.error());
    return 0;
  }
  if (pack.value() == nullptr) return 0;
  for (const PackEntry& entry : pack.value()->manifest().samples) {
    // A loader's first read (checked, decoded whole), its later reads (left compressed for the
    // copy), verify's and unpack's (checked every time, the file put back together).
    for (const auto mode : {CompressedRead::kWhole, CompressedRead::kInCopy}) {
      auto read = pack.value()->read(entry, /*always_check=*/false, mode);
      if (!read.ok()) must_say_why(read.error());
    }
    auto bytes = pack.value()->file_bytes(entry);
    if (!bytes.ok()) {
      must_say_why(bytes.error());
    } else if (bytes.value().size() != entry.file_bytes) {
      std::abort();
    }
  }
  return 0;
}
