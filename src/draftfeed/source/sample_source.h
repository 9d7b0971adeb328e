// One sample on its way into a batch: the hidden states a source fetched for a row, or why it could
// not.
//
// A `SampleSource` is the interface between the store/online stages and assembly: the pipeline asks
// it for a global row, gets either a view of validated hidden states `[T, L, H]` (still in the
// mapped file: nothing copied yet) or a drop reason. Assembly copies from the view straight into
// the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/common/dtype.h"
#include "draftfeed/common/mapped_file.h"
#include "draftfeed/common/stats_tree.h"
#include "draftfeed/dataset/token_dataset.h"
#include "draftfeed/pack/plane_codec.h"

namespace draftfeed {

// Why a sample was dropped from its batch. Counted per reason by the pipeline.
enum class DropReason : std::uint8_t {
  kMissing,           // no cached file (on_missing = skip or warn)
  kMismatch,          // the file's token ids differ from the row's
  kInvalid,           // unreadable, corrupt, or wrong shape/dtype
  kNonFinite,         // NaN or Inf in the hidden states (found while copying)
  kGenerationFailed,  // online generation exhausted its attempts
  kCount,
};
const char* drop_reason_name(DropReason reason);

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

// One batch of an epoch's plan: its position in the full plan (what resume records) and its samples
// as global dataset rows, in packing order.
struct PlannedBatch {
  std::int64_t index = 0;
  std::vector<std::int64_t> rows;
};

// What a loader will fetch, told to its source as each epoch starts, before its first fetch
// (SampleSource::will_need). The loader makes it (loader/loader.h): the plan is the epoch driver's,
// the source only reads ahead of it.
struct ReadAheadPlan {
  // The loader's own: loaders sharing a source (a training and a validation loader) each have one,
  // and a new plan replaces only that loader's.
  int stream = 0;
  // This epoch's batches still to deliver, in delivery order. The loader does not change them
  // until the epoch ends; the source may keep the pointer.
  std::shared_ptr<const std::vector<PlannedBatch>> batches;
  // The next epoch's batches, when the source asked for them (plans_next_epoch) and the loader
  // trains (a validation pass has training after it, and would hold what it fetched all that time).
  std::vector<PlannedBatch> next;
  // The loader's batch buffers' bytes: a read-ahead's budget is given in them by default.
  std::uint64_t batch_memory_bytes = 0;
};

// Fetches the hidden states of rows. Called concurrently from the pipeline's threads.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // `input_ids` is the dataset row (for the token check). Must not throw for a bad sample (return a
  // drop); may throw for a failure that ends the run.
  virtual FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) = 0;

  // The row from what is already stored (a cache file, a transfer's store), without generating
  // it: nullopt when it is not there. A lookahead serves a waiting consumer this way rather than
  // queueing the row behind requests that may block for long. The default: nothing is stored.
  virtual std::optional<FetchOutcome> fetch_stored(std::int64_t /*global_row*/,
                                                   const IntArrayView& /*input_ids*/) {
    return std::nullopt;
  }
  // fetch() of a row fetch_stored() just found not stored: a source skips the second lookup (a
  // custom transfer's get_cached is called once per row, as the reference calls it).
  virtual FetchOutcome fetch_not_stored(std::int64_t global_row, const IntArrayView& input_ids) {
    return fetch(global_row, input_ids);
  }

  // The epoch's plan (above): a source whose reads can start early (cache files opened and read
  // ahead, requests started ahead) starts them, at its own pace and within its own budgets,
  // however far ahead of the batch buffers. Must be cheap and must not block. Called from the
  // loader's thread, concurrently with fetch().
  virtual void will_need(const ReadAheadPlan& /*plan*/) {}
  // Whether will_need wants the next epoch's batches too (ReadAheadPlan::next).
  virtual bool plans_next_epoch() const { return false; }
  // The loader of `stream` is gone: what was read ahead for it alone may go.
  virtual void forget_plan(int /*stream*/) {}
  // Whether the row is stored where a fetch reads it without asking a server, known without a
  // file system call (a packed row: an index lookup). A request lookahead leaves such rows to the
  // claim, its threads for the rows the servers must generate. Called concurrently with fetch().
  virtual bool stored_locally(std::int64_t /*global_row*/) const { return false; }

  // Stopping mid-epoch: the pipeline calls interrupt() so that fetches that may block for long (a
  // request with a two-minute timeout) end now, and resume() once its threads have joined, before
  // the next epoch. Fetches that end because of interrupt() are not failures of the sample.
  virtual void interrupt() {}
  virtual void resume() {}

  // What the source has to report, as named groups (a cache's "read_ahead", an online source's
  // counts and its "lookahead"): the loader's metrics carry them without knowing the source.
  virtual StatsTree stats_report() const { return {}; }

  // How many fetches this source may keep blocked at once for a long time (a request to a server
  // holds its fetch for the whole round trip). The pipeline runs that many threads on top of its
  // own, so blocked fetches never hold back the copies; 0 (the default) for sources whose fetches
  // are short (a file read).
  virtual int blocking_fetches() const { return 0; }
};

}  // namespace draftfeed
