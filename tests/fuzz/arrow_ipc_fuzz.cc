// libFuzzer target for the Arrow IPC stream reader, the token-column checks behind it, and the
// JSON conversion of any column (arrow_json.h, which the online path uses for `messages`).
//
// Build: CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DDRAFTFEED_FUZZ=ON
//          -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAFTFEED_SANITIZE=address,undefined
//        cmake --build build-fuzz --target arrow_ipc_fuzz
// Run:   build-fuzz/arrow_ipc_fuzz -max_total_time=60 CORPUS_DIR
// A useful seed corpus is a few real shards: `draftfeed synth` output and pyarrow streams (lists,
// large lists, narrow ints, a struct column, legacy framing), e.g. every data-*.arrow of the
// folders tests/python/test_dataset.py writes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "draftfeed/dataset/arrow_ipc.h"
#include "draftfeed/dataset/arrow_json.h"
#include "draftfeed/dataset/token_columns.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string name = "fuzz";
  auto stream = draftfeed::arrow::read_ipc_stream(std::span<const std::uint8_t>(data, size), name);
  if (!stream.ok()) return 0;
  const auto columns_info = draftfeed::column_infos(stream.value());
  (void)columns_info;
  // A few rows of every column as JSON, errors ignored: the converter checks everything it reads,
  // so only a crash or a sanitizer report is a finding. The small size limit keeps runs fast.
  const draftfeed::arrow::JsonLimits limits{1 << 16, draftfeed::arrow::kMaxFieldDepth};
  for (const auto& batch : stream->batches) {
    for (std::size_t c = 0; c < batch.columns.size() && c < stream->fields.size(); ++c) {
      for (std::int64_t r = 0; r < batch.length && r < 4; ++r) {
        auto text = draftfeed::arrow::arrow_value_json(stream->fields[c], batch.columns[c], r, name,
                                                       limits);
        (void)text;
      }
    }
  }
  std::vector<std::int64_t> lens;
  auto columns = draftfeed::read_token_columns(stream.value(), name, 0, &lens);
  if (!columns.ok()) return 0;
  // Read every row the checks accepted, as the training path would.
  std::uint64_t sum = 0;
  for (std::size_t b = 0; b < columns->input_ids.size(); ++b) {
    for (std::int64_t r = 0; r < columns->batch_rows[b]; ++r) {
      const auto ids = columns->input_ids[b].row(r);
      for (std::int64_t t = 0; t < ids.size(); ++t) sum += static_cast<std::uint64_t>(ids[t]);
      if (columns->has_loss_mask) {
        const auto mask = columns->loss_mask[b].row(r);
        for (std::int64_t t = 0; t < mask.size(); ++t) sum += static_cast<std::uint64_t>(mask[t]);
      }
    }
  }
  volatile std::uint64_t sink = sum;
  (void)sink;
  return 0;
}
