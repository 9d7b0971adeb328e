// The one depth guard for JSON read from a file or a server (a response body, a dataset's
// state.json, a pack's manifest, a safetensors header). nlohmann's DOM parser recurses once per
// level, so a hostile text of a million '[' would exhaust the stack: every reader scans the text's
// depth with json_depth_within before it parses, and refuses it with json_too_deep_text.
#pragma once

#include <string>
#include <string_view>

namespace draftfeed {

// Deeper than any file or response draftfeed reads legitimately nests (a manifest nests 3, a
// dataset's state.json and a vLLM response a handful), far below a parser's stack.
inline constexpr int kMaxJsonDepth = 64;

// True when `text`'s brackets nest no deeper than `max_depth` (strings and escapes skipped). Not a
// JSON validator: a cheap scan that runs before the parser.
bool json_depth_within(std::string_view text, int max_depth = kMaxJsonDepth);

// "JSON nested deeper than N levels": the words every reader uses for a text the scan refuses.
std::string json_too_deep_text(int max_depth = kMaxJsonDepth);

}  // namespace draftfeed
