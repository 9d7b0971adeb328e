// The offline sample source: hidden states from the cache folder (`hs_<row>.safetensors`), checked
// against the dataset row before anything is copied. Finiteness is checked later, inside the copy.
#pragma once

#include <memory>
#include <string>

#include "draftfeed/batch/sample.h"
#include "draftfeed/hidden/cache_store.h"

namespace draftfeed {

// What to do with a row that has no cached file (the reference's `on_missing`, minus `generate`,
// which the online source implements).
enum class OnMissing : std::uint8_t { kSkip, kWarn, kRaise };
OnMissing parse_on_missing(const std::string& text);  // throws kInvalidArgument naming the choices

class CacheSampleSource : public SampleSource {
 public:
  CacheSampleSource(std::shared_ptr<const CacheStore> store, OnMissing on_missing);
  FetchOutcome fetch(std::int64_t global_row, const IntArrayView& input_ids) override;

  // Checks a loaded file against the row: token ids (int64 [T], equal to the row), hidden states
  // (bf16/f16/f32 [T, L, H]). Shared with the online source.
  static FetchOutcome check(std::int64_t global_row, const IntArrayView& input_ids,
                            const HiddenStateSample& sample);

 private:
  std::shared_ptr<const CacheStore> store_;
  OnMissing on_missing_;
};

}  // namespace draftfeed
