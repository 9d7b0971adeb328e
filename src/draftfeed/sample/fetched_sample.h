// One sample on its way into a batch: the hidden states a source fetched for a row, or why it could
// not.
//
// A source (source/sample_source.h) answers a fetch with a `FetchOutcome`: either a view of
// validated hidden states `[T, L, H]` (still in the mapped file: nothing copied yet) or a drop
// reason. The copy (batch/sample_copy.h) reads from the view straight into the batch. Sources and
// the copy share these values and nothing else.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/mapped_file.h"
#include "draftfeed/pack/plane_codec.h"
#include "draftfeed/sample/drop_reason.h"

namespace draftfeed {

// Hidden states `[tokens, layers, hidden]`, row-major and contiguous, in a file's own dtype.
struct HiddenStatesView {
  const std::uint8_t* data = nullptr;
  DType dtype = DType::kBF16;
  std::int64_t tokens = 0;
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  // F8 E4M3 only (hs-connectors' FP8 files): one float32 scale per token (`tokens` of them,
  // little-endian, any alignment), and the dtype FP8Transfer dequantizes in (bf16, f16 or f32):
  // value = round_D(D(fp8) x D(scale)). Null for other dtypes.
  const std::uint8_t* scales = nullptr;
  DType dequantize = DType::kBF16;
};

struct FetchedSample {
  std::shared_ptr<const void> owner;  // keeps `hidden.data` mapped until the copy is done
  HiddenStatesView hidden;
  // The mapped file `hidden.data` points into, when it is one (null for memory a transfer gave):
  // the copy reads it under a fault guard and checks afterwards that the file did not change.
  std::shared_ptr<const MappedFile> file;
  // The copy (batch/sample_copy.h) reads the rows through `file`'s descriptor when it has one
  // (batch/file_rows_copy.h); false: from the mapping, as for a file without a descriptor (the
  // cache sources' default: source/cache_source.h's CacheCopy).
  bool read_rows = true;
  // Hidden states stored compressed in a packed cache's shard (`file`), which the copy decodes,
  // only the codec chunks of the rows it copies (batch/compressed_rows_copy.h): `hidden` has no
  // data then (its dtype, shape and scales are the decoded tensor's). Null otherwise.
  std::shared_ptr<const CompressedPlanes> compressed;
};

struct FetchOutcome {
  std::optional<FetchedSample> sample;  // set on success
  DropReason reason = DropReason::kMissing;
  std::string message;  // names the row/file and the reason, for logs and the drop examples
  bool fatal = false;   // the run must stop (on_missing = raise, fail_on_hidden_state_error, ...)

  static FetchOutcome ok(FetchedSample sample) {
    FetchOutcome outcome;
    outcome.sample = std::move(sample);
    return outcome;
  }
  static FetchOutcome dropped(DropReason reason, std::string message, bool fatal = false) {
    FetchOutcome outcome;
    outcome.reason = reason;
    outcome.message = std::move(message);
    outcome.fatal = fatal;
    return outcome;
  }
};

}  // namespace draftfeed
