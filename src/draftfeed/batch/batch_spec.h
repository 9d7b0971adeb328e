// What one batch looks like (docs/formats.md, "One batch"): its tensors, their order, dtypes and
// shapes, and where each lives inside the batch's single buffer. Setup-time only: sizes are known
// before any sample is read, so the buffer pool can allocate every batch ahead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "draftfeed/common/dtype.h"

namespace draftfeed {

// Per-sample transforms the reference applies before packing (speculators' preprocess functions).
enum class Preprocess : std::uint8_t {
  kNone,
  kEagle3Shift,  // EAGLE-3 / P-EAGLE `shift_batch`: drop token 0 of ids/mask/positions/last layer,
                 // drop the last row of the target layers
  kMtp,          // `shift_batch_mtp`: the verifier's last layer becomes `hidden_states`
  kCustom,       // a callable the engine does not know (run in Python): each sample is delivered
            // unpacked, with all its rows (cast, noised, checked), and packed after it (pack.h)
};
// "none", "eagle3" (also "peagle", "shift"), "mtp", "custom"; throws kInvalidArgument naming the
// choices.
Preprocess parse_preprocess(std::string_view text);
const char* preprocess_name(Preprocess preprocess);

enum class NoiseKind : std::uint8_t { kNone, kUniform, kGaussian };
// "uniform", "gaussian" (also "normal"), "none"; throws kInvalidArgument naming the choices.
NoiseKind parse_noise_kind(std::string_view text);
const char* noise_kind_name(NoiseKind kind);

struct NoiseSpec {
  NoiseKind kind = NoiseKind::kNone;
  double std = 0.0;  // uniform: x + (2u - 1) * std; gaussian: x + std * n
  std::uint64_t seed = 0;
  // Whether noise is added at all: a kind, and a positive std.
  bool enabled() const { return kind != NoiseKind::kNone && std > 0.0; }
};

struct BatchSpec {
  std::int64_t max_len = 8192;         // rows of every tensor (the reference's total_seq_len)
  std::int64_t hidden_size = 0;        // H
  std::int64_t num_target_layers = 3;  // L - 1: layers flattened into `hidden_states`
  // Of every tensor whose name contains "hidden_states": bf16 or f32 (f16 is refused, as the
  // reference refuses it for training).
  DType dtype = DType::kBF16;
  Preprocess preprocess = Preprocess::kNone;
  NoiseSpec noise;  // applied only where the pipeline says (the training split)

  // The only check of these fields: positive sizes, bf16 or f32 hidden states (f16 refused, as
  // the reference refuses it for training), a finite noise std >= 0. Throws Error
  // (kInvalidArgument) naming the field by the reference's name.
  void validate() const;
};

struct TensorSlot {
  std::string name;
  DType dtype;                      // I64, BOOL, BF16, F16 or F32
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

// Lays out the tensors of a batch of `spec` (spec.validate() first).
BatchLayout make_batch_layout(const BatchSpec& spec);

}  // namespace draftfeed
