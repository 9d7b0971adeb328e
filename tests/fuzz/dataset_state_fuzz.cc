// libFuzzer target for the JSON files of a `datasets` folder: state.json's shard list and the
// bounded JSON parse every dataset file goes through (dataset/dataset_state.h). A dataset folder
// may come from anywhere: only a crash, a hang or a sanitizer report is a finding; a refused file
// is an Error.
//
// Build and run as the other targets (scripts/fuzz.sh dataset_state). Seeds: state.json and
// dataset_info.json files written by the real `datasets` package, and nested ones
// (tests/fuzz/make_corpus.py).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "draftfeed/common/error.h"
#include "draftfeed/dataset/dataset_state.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)draftfeed::shard_names_from_state_json(text, "fuzz/state.json");
  } catch (const draftfeed::Error&) {
  }
  try {
    const auto json = draftfeed::parse_dataset_json(text, "fuzz/dataset_info.json");
    (void)json.dump();  // what a message may print of a parsed file: bounded by the parse
  } catch (const draftfeed::Error&) {
  }
  return 0;
}
