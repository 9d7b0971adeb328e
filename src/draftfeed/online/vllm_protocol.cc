#include "draftfeed/online/vllm_protocol.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/json_depth.h"

namespace draftfeed {

namespace {

using Json = nlohmann::json;

// Parses `body` without exceptions; a discarded value means malformed (or too deep).
Json parse_bounded(std::string_view body) {
  if (!json_depth_within(body)) return Json(Json::value_t::discarded);
  return Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
}

// The object member `key` of `object`, or null when absent (`object` must be an object).
const Json* member(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string clipped(std::string_view text, std::size_t limit = 200) {
  if (text.size() <= limit) return std::string(text);
  return std::string(text.substr(0, limit)) + "... (" + std::to_string(text.size()) + " bytes)";
}

GenerationResponse generation_problem(ResponseProblem problem, std::string message) {
  GenerationResponse out;
  out.problem = problem;
  out.message = std::move(message);
  return out;
}

// Compares the response's prompt ids to the ids sent; fills `out` on a problem.
bool prompt_ids_match(const Json& ids, std::span<const std::int64_t> sent,
                      GenerationResponse& out) {
  if (!ids.is_array()) {
    out = generation_problem(ResponseProblem::kBadPromptIds,
                             std::string("prompt_token_ids is a JSON ") + ids.type_name() +
                                 ", not an array of integers");
    return false;
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer()) {
      out = generation_problem(ResponseProblem::kBadPromptIds,
                               "prompt_token_ids[" + std::to_string(i) + "] is a JSON " +
                                   ids[i].type_name() + ", not an integer");
      return false;
    }
  }
  if (ids.size() != sent.size()) {
    out = generation_problem(ResponseProblem::kPromptIdsMismatch,
                             "the server echoed " + std::to_string(ids.size()) +
                                 " prompt ids for the " + std::to_string(sent.size()) + " sent");
    return false;
  }
  for (std::size_t i = 0; i < sent.size(); ++i) {
    const Json& id = ids[i];
    const bool equal =
        id.is_number_unsigned()
            ? sent[i] >= 0 && id.get<std::uint64_t>() == static_cast<std::uint64_t>(sent[i])
            : id.get<std::int64_t>() == sent[i];
    if (!equal) {
      out = generation_problem(ResponseProblem::kPromptIdsMismatch,
                               "prompt id " + std::to_string(i) + " is " + id.dump() +
                                   " in the response, " + std::to_string(sent[i]) + " sent");
      return false;
    }
  }
  return true;
}

}  // namespace

constexpr std::array<EnumName<ResponseProblem>, 10> kResponseProblemNames = {{
    {ResponseProblem::kNone, "ok"},
    {ResponseProblem::kMalformedJson, "malformed json"},
    {ResponseProblem::kNotAnObject, "not an object"},
    {ResponseProblem::kMissingPromptIds, "missing prompt ids"},
    {ResponseProblem::kBadPromptIds, "bad prompt ids"},
    {ResponseProblem::kPromptIdsMismatch, "prompt ids mismatch"},
    {ResponseProblem::kMissingTransferParams, "missing kv_transfer_params"},
    {ResponseProblem::kMissingHandle, "missing handle"},
    {ResponseProblem::kBadHandle, "bad handle"},
    {ResponseProblem::kMissingModel, "missing model"},
}};
static_assert(kResponseProblemNames.size() == static_cast<std::size_t>(ResponseProblem::kCount) &&
              names_each_value_in_order(kResponseProblemNames));

const char* response_problem_name(ResponseProblem problem) {
  return enum_name(problem, kResponseProblemNames);
}

std::string completions_request_body(std::string_view model, std::span<const std::int64_t> ids) {
  Json body;
  body["model"] = std::string(model);
  body["prompt"] = Json::array();
  auto& prompt = body["prompt"].get_ref<Json::array_t&>();
  prompt.reserve(ids.size());
  for (const std::int64_t id : ids) prompt.emplace_back(id);
  body["max_tokens"] = 1;
  body["return_token_ids"] = true;
  return body.dump();
}

bool continue_final_message_for(std::string_view model) {
  const std::size_t slash = model.rfind('/');
  std::string base(slash == std::string_view::npos ? model : model.substr(slash + 1));
  std::transform(base.begin(), base.end(), base.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return base.find("mistral") != std::string::npos;
}

Result<bool> has_multimodal_content(std::string_view messages_json) {
  const Json messages = parse_bounded(messages_json);
  if (!messages.is_array()) {
    return Error(ErrorKind::kFormat,
                 "messages must be a JSON array of turns, got: " + clipped(messages_json));
  }
  for (const Json& turn : messages) {
    if (!turn.is_object()) continue;
    const Json* content = member(turn, "content");
    if (content != nullptr && content->is_array()) return true;
  }
  return false;
}

Result<std::string> chat_request_body(std::string_view model, std::string_view messages_json) {
  Json messages = parse_bounded(messages_json);
  if (!messages.is_array()) {
    return Error(ErrorKind::kFormat,
                 "messages must be a JSON array of turns, got: " + clipped(messages_json));
  }
  Json body;
  body["model"] = std::string(model);
  body["messages"] = std::move(messages);
  body["max_tokens"] = 1;
  body["add_generation_prompt"] = false;
  body["continue_final_message"] = continue_final_message_for(model);
  body["return_token_ids"] = true;
  return body.dump();
}

GenerationResponse parse_generation_response(std::string_view body, RequestKind kind,
                                             std::span<const std::int64_t> sent_ids) {
  const Json response = parse_bounded(body);
  if (response.is_discarded()) {
    return generation_problem(ResponseProblem::kMalformedJson,
                              "the response is not valid JSON: " + clipped(body));
  }
  if (!response.is_object()) {
    return generation_problem(
        ResponseProblem::kNotAnObject,
        std::string("the response is a JSON ") + response.type_name() + ", not an object");
  }
  const Json* ids = nullptr;
  if (kind == RequestKind::kCompletions) {
    const Json* choices = member(response, "choices");
    if (choices != nullptr && choices->is_array() && !choices->empty() &&
        (*choices)[0].is_object()) {
      ids = member((*choices)[0], "prompt_token_ids");
    }
    if (ids == nullptr || ids->is_null()) {
      return generation_problem(ResponseProblem::kMissingPromptIds,
                                "the response has no choices[0].prompt_token_ids");
    }
  } else {
    ids = member(response, "prompt_token_ids");
    if (ids == nullptr || ids->is_null()) {
      return generation_problem(ResponseProblem::kMissingPromptIds,
                                "the response has no prompt_token_ids");
    }
  }
  GenerationResponse out;
  if (!prompt_ids_match(*ids, sent_ids, out)) return out;

  const Json* params = member(response, "kv_transfer_params");
  if (params == nullptr || !params->is_object()) {
    return generation_problem(ResponseProblem::kMissingTransferParams,
                              "the response has no kv_transfer_params object");
  }
  // The reference takes `hidden_states_path or handle`: an empty or null path falls through.
  const Json* handle = member(*params, "hidden_states_path");
  const char* key = "hidden_states_path";
  const bool path_empty = handle == nullptr || handle->is_null() ||
                          (handle->is_string() && handle->get_ref<const std::string&>().empty());
  if (path_empty) {
    handle = member(*params, "handle");
    key = "handle";
  }
  if (handle == nullptr || handle->is_null()) {
    return generation_problem(ResponseProblem::kMissingHandle,
                              "kv_transfer_params has neither 'hidden_states_path' nor 'handle'");
  }
  if (!handle->is_string() || handle->get_ref<const std::string&>().empty() ||
      handle->get_ref<const std::string&>().find('\0') != std::string::npos) {
    return generation_problem(ResponseProblem::kBadHandle,
                              std::string("kv_transfer_params.") + key +
                                  " must be a non-empty path without NUL bytes, got " +
                                  clipped(handle->dump()));
  }
  out.handle = handle->get<std::string>();
  out.transfer_params = params->dump(-1, ' ', false, Json::error_handler_t::replace);
  return out;
}

ModelsResponse parse_models_response(std::string_view body) {
  ModelsResponse out;
  const Json response = parse_bounded(body);
  if (response.is_discarded()) {
    out.problem = ResponseProblem::kMalformedJson;
    out.message = "the /models response is not valid JSON: " + clipped(body);
    return out;
  }
  const Json* data = response.is_object() ? member(response, "data") : nullptr;
  const Json* id = nullptr;
  if (data != nullptr && data->is_array() && !data->empty() && (*data)[0].is_object()) {
    id = member((*data)[0], "id");
  }
  if (id == nullptr || !id->is_string() || id->get_ref<const std::string&>().empty()) {
    out.problem = ResponseProblem::kMissingModel;
    out.message = "the /models response has no data[0].id string: " + clipped(body);
    return out;
  }
  out.model = id->get<std::string>();
  return out;
}

}  // namespace draftfeed
