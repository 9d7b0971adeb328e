// libFuzzer target for the safetensors parser. Any input must either be refused with a message or
// give views that lie inside the input; an accepted file must survive a write/re-read round trip
// through our writer with the same tensors and metadata. A file with F8_E4M3 `hidden_states` also
// goes through the FP8 scales check and, when its scales pass, the batch copy's dequantize (what
// the engine runs on such a sample), in every dequantize dtype.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/common/finite.h"
#include "draftfeed/hidden/safetensors.h"
#include "draftfeed/hidden/safetensors_writer.h"
#include "draftfeed/hidden/validate.h"

namespace {

void fuzz_fp8(const draftfeed::SafetensorsLayout& layout) {
  using namespace draftfeed;
  const TensorView* states = nullptr;
  const TensorView* scales = nullptr;
  for (const auto& view : layout.tensors) {
    if (view.name == kHiddenStatesKey) states = &view;
    if (view.name == kHiddenStatesScalesKey) scales = &view;
  }
  if (states == nullptr || states->shape.size() != 3) return;
  const std::string problem = fp8_scales_problem(states->dtype, states->shape[0], scales);
  if (!problem.empty() || states->dtype != DType::kF8E4M3 || states->nbytes == 0) return;
  if (states->shape[0] == 0 || states->nbytes > (1u << 20)) return;
  std::vector<float> out(states->nbytes);
  for (const DType dequantize : {DType::kBF16, DType::kF16, DType::kF32}) {
    RowCopy job;
    job.src = states->data;
    job.src_dtype = DType::kF8E4M3;
    job.width = states->shape[1] * states->shape[2];
    job.src_row_stride = job.width;
    job.src_scales = scales->data;
    job.dequantize = dequantize;
    job.dst = reinterpret_cast<std::uint8_t*>(out.data());
    job.dst_dtype = DType::kF32;
    job.dst_row_stride = job.width;
    job.rows = states->shape[0];
    job.noise = NoiseKind::kUniform;
    job.noise_std = 0.05f;
    if (copy_hidden_rows(job) < 0) std::abort();
  }
}

}  // namespace

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
    (void)all_finite(view.data, view.nbytes / std::max<std::size_t>(1, dtype_size(view.dtype)),
                     finite_scan_supports(view.dtype) ? view.dtype : DType::kU8);
    tensors.push_back(TensorToWrite{view.name, view.dtype, view.shape, view.bytes()});
  }
  fuzz_fp8(layout.value());
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
