// wm_serve's request layer (tools/serve/openai_api.h) alone: bodies parsed and refused with 400
// naming the field, never another failure; invalid UTF-8 in a body is a 400 whose error object
// still serializes; the roles and content forms OpenAI's clients send (developer, content-part
// arrays, max_completion_tokens); stop strings the same as a string or in an array; the bearer
// scheme in any case; keys compared whole; session ids; response ids unique.
#include <gtest/gtest.h>

#ifdef WM_HAVE_HTTPLIB
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "tools/serve/openai_api.h"

namespace wm::serve {
namespace openai_api_test {

using json = nlohmann::json;

int status_of(const std::string& body, bool chat, std::string* param = nullptr) {
  try {
    parse_completion(body, chat, RequestLimits{});
    return 200;
  } catch (const ApiError& e) {
    if (param) *param = e.param;
    // The error object serializes whatever the message quotes.
    const json j = json::parse(error_body(e.status, e.what(), e.param, e.code));
    EXPECT_TRUE(j["error"]["message"].is_string());
    return e.status;
  }
}

TEST(OpenAIApi, InvalidUtf8AndMalformedBodiesAre400) {
  EXPECT_EQ(status_of("{\"model\":\"m\",\"prompt\":\"a\xff\xfe\"}", false), 400);
  EXPECT_EQ(status_of("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", true), 400);
  EXPECT_EQ(status_of("not json \xff", false), 400);
  EXPECT_EQ(status_of("[1,2]", false), 400);
  EXPECT_EQ(status_of("", true), 400);
  std::string param;
  EXPECT_EQ(status_of(R"({"model":"m","prompt":"x","max_tokens":18446744073709551615})", false, &param), 400);
  EXPECT_EQ(param, "max_tokens");
  EXPECT_EQ(status_of(R"({"model":"m","prompt":"x","temperature":"hot"})", false, &param), 400);
  EXPECT_EQ(param, "temperature");
  EXPECT_EQ(status_of(R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", true, &param), 400);
  EXPECT_EQ(param, "messages[0].role");
  EXPECT_EQ(status_of(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, &param),
            400);
  EXPECT_EQ(param, "messages[0].content[0].type");
  EXPECT_EQ(status_of(R"({"model":"m","prompt":"x","n":2})", false, &param), 400);
  EXPECT_EQ(param, "n");
  // Deep nesting is refused, not a crash.
  EXPECT_EQ(status_of(std::string(100000, '[') + std::string(100000, ']'), false), 400);
}

TEST(OpenAIApi, RolesContentPartsAndMaxCompletionTokens) {
  const CompletionRequest r = parse_completion(
      R"({"model":"m","max_completion_tokens":7,"messages":[{"role":"developer","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
          {"role":"assistant","content":null,"tool_calls":[]}]})",
      true, RequestLimits{});
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "one\ntwo");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(parse_completion(R"({"model":"m","prompt":"x","max_tokens":5,"max_completion_tokens":5})", false,
                             RequestLimits{}).max_tokens, 5);
  EXPECT_EQ(status_of(R"({"model":"m","prompt":"x","max_tokens":5,"max_completion_tokens":6})", false), 400);
  RequestLimits l;
  l.default_max_tokens = 33;
  EXPECT_EQ(parse_completion(R"({"model":"m","prompt":"x"})", false, l).max_tokens, 33);
}

TEST(OpenAIApi, StopStringsTheSameAsAStringOrInAnArray) {
  auto stops = [](const std::string& stop) {
    return parse_completion(R"({"model":"m","prompt":"x","stop":)" + stop + "}", false, RequestLimits{}).stop;
  };
  EXPECT_TRUE(stops(R"("")").empty());
  EXPECT_TRUE(stops(R"([""])").empty());
  EXPECT_EQ(stops(R"(["a","","b"])"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(stops(R"("end")"), std::vector<std::string>{"end"});
  EXPECT_EQ(status_of(R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})", false), 400);
  EXPECT_EQ(status_of(R"({"model":"m","prompt":"x","stop":[1]})", false), 400);
}

TEST(OpenAIApi, BearerSchemeIsCaseInsensitiveAndKeysCompareWhole) {
  EXPECT_EQ(bearer_token("Bearer k1"), std::optional<std::string>("k1"));
  EXPECT_EQ(bearer_token("bearer k1"), std::optional<std::string>("k1"));
  EXPECT_EQ(bearer_token("BEARER   k1  "), std::optional<std::string>("k1"));
  EXPECT_FALSE(bearer_token("Basic k1").has_value());
  EXPECT_FALSE(bearer_token("Bearer").has_value());
  EXPECT_FALSE(bearer_token("Bearerk1").has_value());
  const std::vector<std::string> keys = {"alpha", "beta"};
  EXPECT_EQ(match_key("beta", keys), std::optional<size_t>(1));
  EXPECT_FALSE(match_key("bet", keys).has_value());
  EXPECT_FALSE(match_key("betaa", keys).has_value());
  EXPECT_FALSE(match_key("", keys).has_value());
  EXPECT_NE(key_tag("alpha"), key_tag("beta"));
  EXPECT_EQ(key_tag("alpha").size(), 12u);
}

TEST(OpenAIApi, KeyFileAndSessionIds) {
  const auto p = std::filesystem::temp_directory_path() / ("wm_keys_" + std::to_string(::getpid()));
  {
    std::ofstream f(p);
    f << "# keys\n  k-one  \n\nk-two\n";
  }
  EXPECT_EQ(read_key_file(p.string()), (std::vector<std::string>{"k-one", "k-two"}));
  {
    std::ofstream f(p);
    f << "# none\n";
  }
  EXPECT_THROW(read_key_file(p.string()), Error);
  std::filesystem::remove(p);
  EXPECT_THROW(read_key_file(p.string()), Error);
  EXPECT_TRUE(valid_session_id("a-b_c.9"));
  EXPECT_FALSE(valid_session_id(std::string("abc\0def", 7)));
  EXPECT_FALSE(valid_session_id("../x/y"));
  EXPECT_FALSE(valid_session_id(std::string(129, 'a')));
  EXPECT_EQ(choose_session("", "b"), "b");
  EXPECT_EQ(choose_session("a", ""), "a");
  EXPECT_THROW(choose_session("a", "b"), ApiError);
  EXPECT_THROW(choose_session("a b", ""), ApiError);
}

TEST(OpenAIApi, ResponseIdsAreUniqueAndJsonTextNeverThrows) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(response_id("cmpl"));
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(response_id("chatcmpl").rfind("chatcmpl-", 0), 0u);
  const std::string t = json_text(json{{"text", std::string("a\xff" "b")}});
  EXPECT_EQ(json::parse(t)["text"], "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(finish_reason("max_tokens"), std::optional<std::string>("length"));
  EXPECT_EQ(finish_reason("stop_string"), std::optional<std::string>("stop"));
  EXPECT_FALSE(finish_reason("interrupted").has_value());
}

}  // namespace openai_api_test
}  // namespace wm::serve
#else
TEST(OpenAIApi, NeedsCppHttplib) { GTEST_SKIP() << "built without cpp-httplib (libcpp-httplib-dev): no wm_serve"; }
#endif
