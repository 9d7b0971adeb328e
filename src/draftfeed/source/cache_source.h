// The offline sample source: hidden states from the cache folder (`hs_<row>.safetensors`), checked
// against the dataset row before anything is copied. Finiteness is checked later, inside the copy.
// Files may be bf16/f16/f32 or hs-connectors' FP8 (F8_E4M3 with per-token scales), mixed in one
// folder: FP8 values are dequantized in the copy as FP8Transfer does, in `fp8_dequantize`.
#pragma once

#include <memory>
#include <string>

#include "draftfeed/hidden/cache_readahead.h"
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
                    DType fp8_dequantize = DType::kBF16);
  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;
  // Queues the rows' files for reading ahead (hidden/cache_readahead.h), so a cold cache is read
  // at the disk's speed, in plan order, ahead of the copy.
  void will_need(std::span<const std::int64_t> rows) override;
  // The pipeline stops: the queued readahead is dropped, at once and again once its threads have
  // joined (its scheduler may queue a batch between the two).
  void interrupt() override;
  void resume() override;
  CacheReadaheadStats readahead_stats() const { return readahead_->stats(); }

  // Checks a loaded file against the row: token ids (int64 [T], equal to the row), hidden states
  // (bf16/f16/f32 [T, L, H], or F8_E4M3 with its scales). Shared with the online source.
  static FetchOutcome check(std::int64_t global_row, const IntArrayView& input_ids,
                            const HiddenStateSample& sample, DType fp8_dequantize = DType::kBF16);

 private:
  std::shared_ptr<const CacheStore> store_;
  OnMissing on_missing_;
  DType fp8_dequantize_;
  std::unique_ptr<CacheReadahead> readahead_;
};

}  // namespace draftfeed
