// libFuzzer target for the safetensors parser. Any input must either be refused with a message or
// give views that lie inside the input; an accepted file must survive a write/re-read round trip
// through our writer with the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "draftfeed/common/finite.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/hidden/safetensors_writer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace draftfeed;
  const std::span<const std::uint8_t> bytes(data, size);
  auto layout = parse_safetensors(bytes, "fuzz");
  if (!layout.ok()) {
    if (layout.error().what()[0] == '\0') std::abort();  // every refusal says why
    return 0;
  }
  std::vector<TensorToWrite> tensors;
  for (const auto& view : layout->tensors) {
    if (view.nbytes > 0 && (view.data < data || view.data + view.nbytes > data + size))
      std::abort();
    (void)all_finite(view.data, view.nbytes / std::max<std::size_t>(1, dtype_bits(view.dtype) / 8),
                     finite_scan_supports(view.dtype) ? view.dtype : DType::kU8);
    tensors.push_back(TensorToWrite{view.name, view.dtype, view.shape, view.bytes()});
  }
  const auto written =
      serialize_safetensors(tensors, layout->has_metadata ? &layout->metadata : nullptr);
  auto reread = parse_safetensors(written, "fuzz-rewritten");
  if (!reread.ok() || reread->tensors.size() != layout->tensors.size() ||
      reread->metadata != layout->metadata) {
    std::abort();
  }
  for (const auto& view : reread->tensors) {
    bool found = false;
    for (const auto& original : layout->tensors) {
      if (original.name != view.name) continue;
      found = original.dtype == view.dtype && original.shape == view.shape &&
              original.nbytes == view.nbytes &&
              (view.nbytes == 0 || std::memcmp(original.data, view.data, view.nbytes) == 0);
    }
    if (!found) std::abort();
  }
  return 0;
}
