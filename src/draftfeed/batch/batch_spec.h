// What one batch looks like (SPEC §5): its tensors, their order, dtypes and shapes, and where each
// lives inside the batch's single buffer. Setup-time only: sizes are known before any sample is
// read, so the buffer pool can allocate every batch ahead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace draftfeed {

// Element types of hidden states, in files and in batches. F8 E4M3 (common/fp8.h) is a file type
// only: its values come with one scale per token and are dequantized into a batch's bf16 or f32.
enum class HiddenDType : std::uint8_t { kBF16, kF16, kF32, kF8E4M3 };
constexpr std::size_t hidden_dtype_size(HiddenDType dtype) {
  return dtype == HiddenDType::kF32 ? 4 : dtype == HiddenDType::kF8E4M3 ? 1 : 2;
}
// "bfloat16", "float16", "float32", "float8_e4m3fn" (torch's names)
const char* hidden_dtype_name(HiddenDType dtype);

// Per-sample transforms the reference applies before packing (speculators' preprocess functions).
enum class Preprocess : std::uint8_t {
  kNone,
  kEagle3Shift,  // EAGLE-3 / P-EAGLE `shift_batch`: drop token 0 of ids/mask/positions/last layer,
                 // drop the last row of the target layers
  kMtp,          // `shift_batch_mtp`: the verifier's last layer becomes `hidden_states`
  kCustom,       // a callable the engine does not know (run in Python): each sample is delivered
            // unpacked, with all its rows (cast, noised, checked), and packed after it (pack.h)
};

enum class NoiseKind : std::uint8_t { kNone, kUniform, kGaussian };

struct NoiseSpec {
  NoiseKind kind = NoiseKind::kNone;
  double std = 0.0;  // uniform: x + (2u - 1) * std; gaussian: x + std * n
  std::uint64_t seed = 0;
};

struct BatchSpec {
  std::int64_t max_len = 8192;             // rows of every tensor (the reference's total_seq_len)
  std::int64_t hidden_size = 0;            // H
  std::int64_t num_target_layers = 3;      // L - 1: layers flattened into `hidden_states`
  HiddenDType dtype = HiddenDType::kBF16;  // of every tensor whose name contains "hidden_states"
  Preprocess preprocess = Preprocess::kNone;
  NoiseSpec noise;  // applied only where the pipeline says (the training split)
};

// DLPack-style element description of a batch tensor.
enum class TensorDType : std::uint8_t { kInt64, kBool, kBF16, kF16, kF32 };
std::size_t tensor_dtype_size(TensorDType dtype);

struct TensorSlot {
  std::string name;
  TensorDType dtype;
  std::vector<std::int64_t> shape;  // with the leading batch dimension of 1
  std::size_t offset;               // bytes from the start of the batch buffer
  std::size_t nbytes;
};

// The tensors of a batch in the reference's key order, laid out back to back (each aligned to 64
// bytes).
struct BatchLayout {
  BatchSpec spec;
  std::vector<TensorSlot> tensors;
  std::size_t total_bytes = 0;

  const TensorSlot* find(const std::string& name) const;
  // Width in elements of one row of the target-layer tensor / the last-layer tensor (0 if absent).
  std::int64_t target_row_width() const;
  std::int64_t last_row_width() const;
};

// Where the tensors of one batch are: a pointer per slot of its layout, in the layout's order.
// A batch in one buffer has base + offset for each; a slot may also lie apart (the pool gives a
// slot memory of its own while a consumer still holds the buffer's, see pipeline/buffer_pool.h).
using BatchMemory = std::vector<std::uint8_t*>;
BatchMemory contiguous_memory(const BatchLayout& layout, std::uint8_t* base);
// The slot of the tensor `name` (which the layout must have).
std::uint8_t* slot_data(const BatchLayout& layout, const BatchMemory& memory, const char* name);

// Validates the spec (positive sizes, fp16 refused as the reference refuses it for training) and
// lays out the tensors. Throws Error(kInvalidArgument) naming the bad field.
BatchLayout make_batch_layout(const BatchSpec& spec);

}  // namespace draftfeed
