// wm_serve's request layer (tools/serve/openai_api.h) alone: bodies parsed and refused with 400
// naming the field, never another failure; invalid UTF-8 in a body is a 400 whose error object
// still serializes; the roles and content forms OpenAI's clients send (developer, content-part
// arrays, max_completion_tokens); stop strings the same as a string or in an array; the bearer
// scheme in any case; keys compared whole; session ids; response ids unique; logprobs and
// top_logprobs validated, and their JSON (exact bytes, valid UTF-8 text, bounded values).
#include <gtest/gtest.h>

#ifdef WM_HAVE_HTTPLIB
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/temp_dir.h"
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
  const std::filesystem::path dir = wm::testing::make_temp_dir("wm_keys_");
  const auto p = dir / "keys";
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
  std::filesystem::remove_all(dir);
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

TEST(OpenAIApi, LogprobsAndTopLogprobsAreValidatedNamingTheField) {
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"x"}])";
  auto with = [&](const std::string& fields) { return chat + "," + fields + "}"; };
  // Accepted: absent, null, false, true, true with 0 and 20 alternatives.
  CompletionRequest r = parse_completion(chat + "}", true, RequestLimits{});
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  r = parse_completion(with(R"("logprobs":null,"top_logprobs":null)"), true, RequestLimits{});
  EXPECT_FALSE(r.logprobs);
  r = parse_completion(with(R"("logprobs":false)"), true, RequestLimits{});
  EXPECT_FALSE(r.logprobs);
  r = parse_completion(with(R"("logprobs":true)"), true, RequestLimits{});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  r = parse_completion(with(R"("logprobs":true,"top_logprobs":20)"), true, RequestLimits{});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 20);
  r = parse_completion(with(R"("logprobs":true,"top_logprobs":0)"), true, RequestLimits{});
  EXPECT_EQ(r.top_logprobs, 0);
  // Refused, each naming its field.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("logprobs":1)", "logprobs"},
      {R"("logprobs":"true")", "logprobs"},
      {R"("logprobs":[true])", "logprobs"},
      {R"("top_logprobs":5)", "top_logprobs"},
      {R"("logprobs":false,"top_logprobs":5)", "top_logprobs"},
      {R"("logprobs":false,"top_logprobs":0)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":21)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":-1)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":2.5)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":"5")", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":true)", "top_logprobs"},
      {R"("logprobs":true,"top_logprobs":18446744073709551615)", "top_logprobs"},
  };
  for (const auto& [fields, field] : bad) {
    std::string param;
    EXPECT_EQ(status_of(with(fields), true, &param), 400) << fields;
    EXPECT_EQ(param, field) << fields;
  }
  // Text completions: OpenAI's older integer, 0-20 alternatives.
  const std::string text = R"({"model":"m","prompt":"x")";
  r = parse_completion(text + "}", false, RequestLimits{});
  EXPECT_FALSE(r.logprobs);
  r = parse_completion(text + R"(,"logprobs":0})", false, RequestLimits{});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  r = parse_completion(text + R"(,"logprobs":5})", false, RequestLimits{});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 5);
  for (const std::string v : {"true", "21", "-1", "\"3\"", "1.5"}) {
    std::string param;
    EXPECT_EQ(status_of(text + R"(,"logprobs":)" + v + "}", false, &param), 400) << v;
    EXPECT_EQ(param, "logprobs") << v;
  }
}

// Tokens that hold part of a character: "bytes" exact, "token" valid UTF-8 (U+FFFD for the part),
// the JSON always serializable; log-probabilities within [-9999, 0]; the older form's offsets.
TEST(OpenAIApi, LogprobsJsonKeepsBytesAndStaysValidUtf8) {
  // "é" is C3 A9, cut across two tokens; then a plain token; then a byte that is never UTF-8.
  const std::vector<LogprobToken> tokens = {
      {7, "\xC3", -0.5, {{7, "\xC3", -0.5, {}}, {9, "x", -1.25, {}}}},
      {8, "\xA9!", -std::numeric_limits<double>::infinity(), {}},
      {3, " ok", -0.0, {}},
      {4, "\xFF", std::nan(""), {}},
  };
  const json c = chat_logprobs(tokens);
  const json round = json::parse(json_text(c));  // serializes; parses back the same
  EXPECT_EQ(round, c);
  ASSERT_EQ(c["content"].size(), 4u);
  const json& e0 = c["content"][0];
  EXPECT_EQ(e0["id"], 7);
  EXPECT_EQ(e0["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(e0["bytes"], json::array({0xC3}));
  EXPECT_EQ(e0["logprob"], -0.5);
  ASSERT_EQ(e0["top_logprobs"].size(), 2u);
  EXPECT_EQ(e0["top_logprobs"][1]["token"], "x");
  EXPECT_EQ(e0["top_logprobs"][1]["logprob"], -1.25);
  EXPECT_FALSE(e0["top_logprobs"][1].contains("top_logprobs"));
  EXPECT_EQ(c["content"][1]["token"], "\xEF\xBF\xBD!");
  EXPECT_EQ(c["content"][1]["bytes"], json::array({0xA9, '!'}));
  EXPECT_EQ(c["content"][1]["logprob"], -9999.0);  // -inf: OpenAI's floor
  EXPECT_EQ(c["content"][1]["top_logprobs"], json::array());
  EXPECT_EQ(c["content"][2]["logprob"], 0.0);
  EXPECT_EQ(c["content"][3]["logprob"], -9999.0);  // NaN
  EXPECT_EQ(c["content"][3]["bytes"], json::array({0xFF}));
  std::string bytes;
  for (const auto& e : c["content"])
    for (const auto& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
  EXPECT_EQ(bytes, "\xC3\xA9! ok\xFF");
  // The older form: offsets in characters, continued across calls (a stream's chunks).
  int64_t offset = 0;
  const json t1 = text_logprobs({tokens[0], tokens[1]}, &offset);
  EXPECT_EQ(t1["tokens"], json::array({"\xEF\xBF\xBD", "\xEF\xBF\xBD!"}));
  EXPECT_EQ(t1["text_offset"], json::array({0, 1}));
  EXPECT_EQ(t1["top_logprobs"][0], json({{"\xEF\xBF\xBD", -0.5}, {"x", -1.25}}));
  EXPECT_EQ(offset, 2);  // "é!": two characters
  const json t2 = text_logprobs({tokens[2]}, &offset);
  EXPECT_EQ(t2["text_offset"], json::array({2}));
  EXPECT_EQ(t2["token_logprobs"], json::array({0.0}));
  EXPECT_EQ(offset, 5);
  EXPECT_NO_THROW((void)json_text(t1));
}

}  // namespace openai_api_test
}  // namespace wm::serve
#else
TEST(OpenAIApi, NeedsCppHttplib) { GTEST_SKIP() << "built without cpp-httplib (libcpp-httplib-dev): no wm_serve"; }
#endif
