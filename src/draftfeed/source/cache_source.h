// The offline sample source: hidden states from the cache folder (`hs_<row>.safetensors`, flat or
// sharded: cache_layout.h), checked against the dataset row before anything is copied. Finiteness
// is checked later, inside the copy. The epoch's files are opened and read ahead in plan order
// (cache_prefetch.h), so a cold cache streams at the disk's speed and a network file system's
// round trips overlap instead of adding up.
// Files may be bf16/f16/f32 or hs-connectors' FP8 (F8_E4M3 with per-token scales), mixed in one
// folder: FP8 values are dequantized in the copy as FP8Transfer does, in `fp8_dequantize`.
#pragma once

#include <memory>
#include <string>

#include "draftfeed/hidden/cache_prefetch.h"
#include "draftfeed/hidden/cache_store.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

// What to do with a row that has no cached file (the reference's `on_missing`, minus `generate`,
// which the online source implements).
enum class OnMissing : std::uint8_t { kSkip, kWarn, kRaise };
OnMissing parse_on_missing(const std::string& text);  // throws kInvalidArgument naming the choices

// FP8Transfer's `dequantize_dtype` by torch's name ("bfloat16", "float16", "float32", with or
// without "torch."); throws kInvalidArgument naming the choices.
DType parse_fp8_dequantize(const std::string& text);

class CacheSampleSource : public SampleSource {
 public:
  // `fp8_dequantize`: FP8Transfer's dequantize_dtype (bf16, f16 or f32; kInvalidArgument else).
  CacheSampleSource(std::shared_ptr<const CacheStore> store, OnMissing on_missing,
                    DType fp8_dequantize = DType::kBF16, CachePrefetchOptions prefetch = {});
  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;
  // The epoch's files are opened and read ahead in this order (hidden/cache_prefetch.h).
  void will_need(std::shared_ptr<const std::vector<PlannedBatch>> batches) override;
  // The pipeline stops: what was prepared ahead is dropped, at once and again once its threads
  // have joined.
  void interrupt() override;
  void resume() override;
  CachePrefetchStats prefetch_stats() const { return prefetch_->stats(); }

  // Checks a loaded file against the row: token ids (int64 [T], equal to the row), hidden states
  // (bf16/f16/f32 [T, L, H], or F8_E4M3 with its scales). Shared with the online source.
  static FetchOutcome check(std::int64_t global_row, const IntArrayView& input_ids,
                            const HiddenStateSample& sample, DType fp8_dequantize = DType::kBF16);

 private:
  std::shared_ptr<const CacheStore> store_;
  OnMissing on_missing_;
  DType fp8_dequantize_;
  std::unique_ptr<CachePrefetch> prefetch_;
};

}  // namespace draftfeed
