// The vLLM hidden-state protocol as bytes (docs/protocol.md, steps 1-3): request bodies to send and
// checks of the response bodies a server returns. Pure functions, no I/O: the fuzz target
// (tests/fuzz/vllm_response_fuzz.cc) and the gtests call them directly.
//
// Responses are untrusted: a body is parsed only after a cheap scan bounds its nesting depth (so a
// hostile `[[[[...` cannot exhaust the stack), and every field is checked for presence and type.
// A failed check is an *invalid response*: the HTTP layer does not retry it (the generate-load-
// validate round trip may).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "draftfeed/common/error.h"

namespace draftfeed {

enum class RequestKind : std::uint8_t {
  kCompletions,  // POST {endpoint}/completions, ids as the prompt (text rows)
  kChat,         // POST {endpoint}/chat/completions, the row's messages (multimodal rows)
};

// Why a response was refused.
enum class ResponseProblem : std::uint8_t {
  kNone,
  kMalformedJson,          // not JSON, truncated, or nested deeper than kMaxJsonDepth
  kNotAnObject,            // valid JSON, but not an object where one is needed
  kMissingPromptIds,       // no choices[0].prompt_token_ids (completions) / prompt_token_ids (chat)
  kBadPromptIds,           // prompt ids present but not an array of integers
  kPromptIdsMismatch,      // prompt ids differ from the ids sent (length or a value)
  kMissingTransferParams,  // no kv_transfer_params object
  kMissingHandle,          // neither kv_transfer_params.hidden_states_path nor .handle
  kBadHandle,              // the handle is not a non-empty string without NUL bytes
  kMissingModel,           // /models: no data[0].id string
  kCount,
};

// "ok", "malformed json", "not an object", "missing prompt ids", "bad prompt ids",
// "prompt ids mismatch", "missing kv_transfer_params", "missing handle", "bad handle",
// "missing model".
const char* response_problem_name(ResponseProblem problem);

// The outcome of checking a generation response: the handle (a path to a safetensors file written
// by the server) or the problem, with a message that names the numbers that disagree.
struct GenerationResponse {
  ResponseProblem problem = ResponseProblem::kNone;
  std::string message;
  std::string handle;
  std::string transfer_params;  // kv_transfer_params as JSON text, for a non-file transfer
  bool ok() const { return problem == ResponseProblem::kNone; }
};

// The outcome of checking a `GET /models` response: `data[0].id`.
struct ModelsResponse {
  ResponseProblem problem = ResponseProblem::kNone;
  std::string message;
  std::string model;
  bool ok() const { return problem == ResponseProblem::kNone; }
};

// `{"model": model, "prompt": [ids], "max_tokens": 1, "return_token_ids": true}`.
std::string completions_request_body(std::string_view model, std::span<const std::int64_t> ids);

// `{"model", "messages", "max_tokens": 1, "add_generation_prompt": false,
//   "continue_final_message": continue_final_message_for(model), "return_token_ids": true}`.
// `messages_json` is the row's `messages` column as JSON text (an array of turns); kFormat when it
// is not a JSON array.
Result<std::string> chat_request_body(std::string_view model, std::string_view messages_json);

// True for models whose chat template closes the final turn with an extra EOS (the basename after
// the last '/' contains "mistral", case-insensitive): their final turn is left open.
bool continue_final_message_for(std::string_view model);

// True when some turn's `content` is a list of parts (images, audio...): such rows need the chat
// request. kFormat when `messages_json` is not a JSON array.
Result<bool> has_multimodal_content(std::string_view messages_json);

// Checks a generation response against the ids sent: the prompt ids (choices[0].prompt_token_ids
// for completions, top-level prompt_token_ids for chat) must equal `sent_ids`; the handle is
// kv_transfer_params.hidden_states_path, or .handle when that is absent, null or empty.
GenerationResponse parse_generation_response(std::string_view body, RequestKind kind,
                                             std::span<const std::int64_t> sent_ids);

// Checks a `GET {endpoint}/models` response and takes data[0].id.
ModelsResponse parse_models_response(std::string_view body);

}  // namespace draftfeed
