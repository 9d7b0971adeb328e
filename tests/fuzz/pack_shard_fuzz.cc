// libFuzzer target for a packed shard's index (pack/shard_layout.h) and the planes-zstd decoder
// (pack/plane_codec.h). A shard the safetensors parser accepts must be indexed or refused with a
// message; an indexed sample's parts lie inside the input and after its header; a compressed part
// (whose decoded size is small enough) decodes or is refused, never read past. The input is also
// given to the decoder as a bare blob, as bf16 and as FP8 values.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/pack/plane_codec.h"
#include "draftfeed/pack/shard_layout.h"

namespace {

void decode_bare(std::span<const std::uint8_t> bytes) {
  using namespace draftfeed;
  if (bytes.size() < 16) return;
  std::uint64_t values = 0;
  for (int i = 0; i < 8; ++i) values |= static_cast<std::uint64_t>(bytes[8 + i]) << (8 * i);
  if (values > (1u << 16)) return;
  for (const DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    std::vector<std::uint8_t> out(values * dtype_size(dtype));
    (void)plane_decode(dtype, bytes, out);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace draftfeed;
  const std::span<const std::uint8_t> bytes(data, size);
  decode_bare(bytes);
  auto layout = parse_safetensors(bytes, "fuzz");
  if (!layout.ok()) return 0;
  auto index = index_pack_shard(layout->tensors, layout->metadata, "fuzz");
  if (!index.ok()) {
    if (index.error().what()[0] == '\0') std::abort();
    return 0;
  }
  for (const auto& [row, sample] : index.value()) {
    if (sample.row != row || sample.begin > sample.end || sample.end > size) std::abort();
    for (const PackedPart& part : sample.parts) {
      const TensorView& v = part.view;
      if (v.nbytes > 0 && (v.data < data || v.data + v.nbytes > data + size)) std::abort();
      if (v.file_offset < sample.begin || v.file_offset + v.nbytes > sample.end) std::abort();
      if (!part.compressed || part.decoded_bytes > (1u << 20)) continue;
      std::vector<std::uint8_t> out(part.decoded_bytes);
      (void)plane_decode(part.dtype, v.bytes(), out);
    }
  }
  return 0;
}
