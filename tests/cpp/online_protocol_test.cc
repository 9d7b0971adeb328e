// The vLLM protocol's pure functions: request bodies (parsed back with nlohmann and compared field
// by field with docs/protocol.md) and every way a response can be refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "draftfeed/online/vllm_protocol.h"

namespace draftfeed {
namespace {

using Json = nlohmann::json;

const std::vector<std::int64_t> kIds = {101, 7, 0, 31999};

std::string completion_with(const Json& ids, const Json& params) {
  Json body = {{"id", "cmpl-1"}, {"object", "text_completion"}};
  body["choices"] = Json::array({Json{{"index", 0}, {"text", " "}, {"prompt_token_ids", ids}}});
  if (!params.is_null()) body["kv_transfer_params"] = params;
  return body.dump();
}

TEST(OnlineProtocolTest, CompletionsRequestHasTheSpecFields) {
  const Json body = Json::parse(completions_request_body("org/model-8b", kIds));
  EXPECT_EQ(body.size(), 4u);
  EXPECT_EQ(body["model"], "org/model-8b");
  EXPECT_EQ(body["prompt"].get<std::vector<std::int64_t>>(), kIds);
  EXPECT_EQ(body["max_tokens"], 1);
  EXPECT_EQ(body["return_token_ids"], true);
}

TEST(OnlineProtocolTest, ChatRequestHasTheSpecFields) {
  const std::string messages =
      R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},)"
      R"({"type":"text","text":"hi"}]},{"role":"assistant","content":"ok"}])";
  auto body_text = chat_request_body("mistralai/Mistral-Small-3.1", messages);
  ASSERT_TRUE(body_text.ok());
  const Json body = Json::parse(body_text.value());
  EXPECT_EQ(body["model"], "mistralai/Mistral-Small-3.1");
  EXPECT_EQ(body["messages"], Json::parse(messages));
  EXPECT_EQ(body["max_tokens"], 1);
  EXPECT_EQ(body["add_generation_prompt"], false);
  EXPECT_EQ(body["continue_final_message"], true);
  EXPECT_EQ(body["return_token_ids"], true);
  EXPECT_EQ(
      Json::parse(chat_request_body("Qwen/Qwen2.5-VL", "[]").value())["continue_final_message"],
      false);
  EXPECT_FALSE(chat_request_body("m", R"({"role":"user"})").ok());
  EXPECT_FALSE(chat_request_body("m", "not json").ok());
}

TEST(OnlineProtocolTest, ContinueFinalMessageOnlyForMistralBasenames) {
  EXPECT_TRUE(continue_final_message_for("mistralai/Mistral-7B-Instruct"));
  EXPECT_TRUE(continue_final_message_for("MISTRAL-small"));
  // The organisation prefix alone does not count: only the basename after the last '/'.
  EXPECT_FALSE(continue_final_message_for("mistralai/Pixtral-12B"));
  EXPECT_FALSE(continue_final_message_for("meta-llama/Llama-3.1-8B"));
}

TEST(OnlineProtocolTest, MultimodalMeansSomeContentIsAList) {
  EXPECT_TRUE(has_multimodal_content(R"([{"role":"user","content":[{"type":"text"}]}])").value());
  EXPECT_FALSE(has_multimodal_content(R"([{"role":"user","content":"text"}])").value());
  EXPECT_FALSE(has_multimodal_content("[]").value());
  EXPECT_FALSE(has_multimodal_content("{}").ok());
}

TEST(OnlineProtocolTest, AcceptsAValidCompletionAndTakesTheHandle) {
  const auto r = parse_generation_response(
      completion_with(kIds, {{"hidden_states_path", "/srv/hs/a.safetensors"}}),
      RequestKind::kCompletions, kIds);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.handle, "/srv/hs/a.safetensors");
}

TEST(OnlineProtocolTest, HandleFallsBackWhenThePathIsAbsentNullOrEmpty) {
  for (int variant = 0; variant < 3; ++variant) {
    Json params = {{"handle", "/srv/h.safetensors"}};
    if (variant == 1) params["hidden_states_path"] = "";
    if (variant == 2) params["hidden_states_path"] = nullptr;
    const auto r =
        parse_generation_response(completion_with(kIds, params), RequestKind::kCompletions, kIds);
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.handle, "/srv/h.safetensors");
  }
}

TEST(OnlineProtocolTest, ChatResponsesCarryTopLevelPromptIds) {
  Json body = {{"prompt_token_ids", kIds},
               {"kv_transfer_params", {{"hidden_states_path", "/x.safetensors"}}}};
  EXPECT_TRUE(parse_generation_response(body.dump(), RequestKind::kChat, kIds).ok());
  // The completions location is not accepted for chat, nor the reverse.
  EXPECT_EQ(parse_generation_response(body.dump(), RequestKind::kCompletions, kIds).problem,
            ResponseProblem::kMissingPromptIds);
  EXPECT_EQ(
      parse_generation_response(completion_with(kIds, {{"handle", "/x"}}), RequestKind::kChat, kIds)
          .problem,
      ResponseProblem::kMissingPromptIds);
}

TEST(OnlineProtocolTest, RefusesEveryKindOfBadResponse) {
  struct Case {
    std::string body;
    ResponseProblem problem;
    std::string needle;  // a piece of the message
  };
  const Json good_params = {{"hidden_states_path", "/x.safetensors"}};
  std::vector<std::int64_t> longer = kIds;
  longer.push_back(5);
  std::vector<std::int64_t> changed = kIds;
  changed[2] = 1;
  const std::vector<Case> cases = {
      {"", ResponseProblem::kMalformedJson, "not valid JSON"},
      {R"({"choices": [{"prompt_token_ids": [1, 2)", ResponseProblem::kMalformedJson, "JSON"},
      {"[1, 2]", ResponseProblem::kNotAnObject, "array"},
      {R"({"choices": []})", ResponseProblem::kMissingPromptIds, "choices[0]"},
      {R"({"choices": [{"prompt_token_ids": null}]})", ResponseProblem::kMissingPromptIds, ""},
      {completion_with("1 2 3", good_params), ResponseProblem::kBadPromptIds, "string"},
      {completion_with({1, 2.5, 3, 4}, good_params), ResponseProblem::kBadPromptIds, "[1]"},
      {completion_with(longer, good_params), ResponseProblem::kPromptIdsMismatch, "5 prompt ids"},
      {completion_with(changed, good_params), ResponseProblem::kPromptIdsMismatch,
       "prompt id 2 is 1 in the response, 0 sent"},
      {completion_with(kIds, nullptr), ResponseProblem::kMissingTransferParams, ""},
      {completion_with(kIds, Json::object()), ResponseProblem::kMissingHandle, "neither"},
      {completion_with(kIds, {{"hidden_states_path", 42}}), ResponseProblem::kBadHandle, "42"},
      {completion_with(kIds, {{"handle", std::string("a\0b", 3)}}), ResponseProblem::kBadHandle,
       "NUL"},
      {completion_with(kIds, {{"handle", ""}}), ResponseProblem::kBadHandle, ""},
  };
  for (const Case& c : cases) {
    const auto r = parse_generation_response(c.body, RequestKind::kCompletions, kIds);
    EXPECT_EQ(r.problem, c.problem) << c.body << " -> " << r.message;
    EXPECT_NE(r.message.find(c.needle), std::string::npos) << r.message;
    EXPECT_TRUE(r.handle.empty());
  }
}

TEST(OnlineProtocolTest, HugeIdsDoNotWrapAround) {
  // 2^64 - 1 as an unsigned JSON number must not equal -1.
  const std::vector<std::int64_t> minus_one = {-1};
  const std::string body = R"({"choices":[{"prompt_token_ids":[18446744073709551615]}],)"
                           R"("kv_transfer_params":{"handle":"/x"}})";
  EXPECT_EQ(parse_generation_response(body, RequestKind::kCompletions, minus_one).problem,
            ResponseProblem::kPromptIdsMismatch);
}

TEST(OnlineProtocolTest, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(parse_generation_response(deep, RequestKind::kCompletions, kIds).problem,
            ResponseProblem::kMalformedJson);
}

TEST(OnlineProtocolTest, ModelsResponseGivesTheFirstId) {
  const auto ok = parse_models_response(
      R"({"object":"list","data":[{"id":"org/m","object":"model"},{"id":"other"}]})");
  ASSERT_TRUE(ok.ok()) << ok.message;
  EXPECT_EQ(ok.model, "org/m");
  for (const char* bad : {R"({"data":[]})", R"({"data":[{"id":3}]})", R"({"object":"list"})", "[]",
                          R"({"data":[{"id":""}]})"}) {
    EXPECT_EQ(parse_models_response(bad).problem, ResponseProblem::kMissingModel) << bad;
  }
  EXPECT_EQ(parse_models_response("{").problem, ResponseProblem::kMalformedJson);
}

TEST(OnlineProtocolTest, ProblemNamesAreDistinct) {
  std::vector<std::string> names;
  for (int p = 0; p < static_cast<int>(ResponseProblem::kCount); ++p) {
    const std::string name = response_problem_name(static_cast<ResponseProblem>(p));
    for (const auto& other : names) EXPECT_NE(name, other);
    names.push_back(name);
  }
}

}  // namespace
}  // namespace draftfeed
