#include <string>

#include "draftfeed/batch/batch_spec.h"
#include "draftfeed/common/error.h"

namespace draftfeed {

const TensorSlot* BatchLayout::find(const std::string& name) const {
  for (const auto& slot : tensors) {
    if (slot.name == name) return &slot;
  }
  return nullptr;
}

std::int64_t BatchLayout::target_row_width() const {
  const TensorSlot* slot = find("hidden_states");
  return slot == nullptr ? 0 : slot->shape.back();
}

std::int64_t BatchLayout::last_row_width() const {
  const TensorSlot* slot = find("verifier_last_hidden_states");
  return slot == nullptr ? 0 : slot->shape.back();
}

BatchMemory contiguous_memory(const BatchLayout& layout, std::uint8_t* base) {
  BatchMemory memory;
  for (const TensorSlot& slot : layout.tensors) memory.push_back(base + slot.offset);
  return memory;
}

std::uint8_t* slot_data(const BatchLayout& layout, const BatchMemory& memory, const char* name) {
  const TensorSlot* slot = layout.find(name);
  return memory[static_cast<std::size_t>(slot - layout.tensors.data())];
}

BatchLayout make_batch_layout(const BatchSpec& spec) {
  spec.validate();

  const DType hidden = spec.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const std::int64_t n = spec.max_len;
  const std::int64_t target_width = spec.num_target_layers * spec.hidden_size;

  // Key order is the reference collate's: the first sample's keys after preprocess, `lengths`
  // removed, `document_ids` appended.
  std::vector<TensorSlot> tensors;
  auto add = [&](const char* name, DType dtype, std::vector<std::int64_t> shape) {
    tensors.push_back(TensorSlot{name, dtype, std::move(shape), 0, 0});
  };
  switch (spec.preprocess) {
    case Preprocess::kNone:
    case Preprocess::kCustom:  // the samples' staging area: the reference sample's tensors
      add("hidden_states", hidden, {1, n, target_width});
      add("input_ids", DType::kI64, {1, n});
      add("verifier_last_hidden_states", hidden, {1, n, spec.hidden_size});
      break;
    case Preprocess::kEagle3Shift:
      add("input_ids", DType::kI64, {1, n});
      add("hidden_states", hidden, {1, n, target_width});
      add("verifier_last_hidden_states", hidden, {1, n, spec.hidden_size});
      break;
    case Preprocess::kMtp:
      add("input_ids", DType::kI64, {1, n});
      add("hidden_states", hidden, {1, n, spec.hidden_size});
      break;
  }
  add("loss_mask", DType::kI64, {1, n});
  add("position_ids", DType::kI64, {1, n});
  add("document_ids", DType::kI64, {1, n});

  BatchLayout layout;
  layout.spec = spec;
  std::size_t offset = 0;
  for (auto& slot : tensors) {
    std::size_t elements = 1;
    for (const auto dim : slot.shape) elements *= static_cast<std::size_t>(dim);
    slot.offset = offset;
    slot.nbytes = elements * dtype_size(slot.dtype);
    offset = (offset + slot.nbytes + 63) / 64 * 64;
  }
  layout.tensors = std::move(tensors);
  layout.total_bytes = offset;
  return layout;
}

}  // namespace draftfeed
