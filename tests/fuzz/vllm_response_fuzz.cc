// libFuzzer target for the vLLM response checks: any bytes as a completions, chat or /models
// response body must give an answer (a handle or a problem), never a crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "draftfeed/online/vllm_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  static const std::vector<std::int64_t> ids = {1, 2, 3};
  (void)draftfeed::parse_generation_response(body, draftfeed::RequestKind::kCompletions, ids);
  (void)draftfeed::parse_generation_response(body, draftfeed::RequestKind::kChat, ids);
  (void)draftfeed::parse_models_response(body);
  (void)draftfeed::has_multimodal_content(body);
  return 0;
}
