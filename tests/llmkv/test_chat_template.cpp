// ChatTemplate (llmkv/chat_template.h) against transformers' apply_chat_template: every template
// of tests/llmkv/fixtures/chat_templates/ on every conversation there, with and without the
// generation prompt, byte for byte (tools/chat_template_fixtures/make_fixtures.py made them); the
// built-in templates, Hugging Face folders, SmolLM2's GGUF template, and the ChatML of
// render_chatml.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "llmkv/chat_template.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "tests/temp_dir.h"

namespace wm::llm::chat_template_test {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const std::string kDir = std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/chat_templates/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

struct TempDir {
  fs::path path;
  TempDir() : path(wm::testing::make_temp_dir("wm_chat_template_")) {}
  ~TempDir() { fs::remove_all(path); }
};

const char* const kFixtures[] = {"chatml",   "smollm2",  "qwen2",           "qwen2.5",    "llama3",
                                 "llama3.1", "llama3.2", "qwen3",           "hermes2pro", "mistral-nemo",
                                 "phi3.5",   "gemma2",   "deepseek-r1-qwen"};

TEST(ChatTemplates, RenderAsTransformersDoes) {
  std::map<std::string, ordered_json> conversations;
  for (const auto& c : ordered_json::parse(slurp(kDir + "conversations.json"))) conversations[c["name"]] = c;
  ASSERT_GE(conversations.size(), 20u);
  int total = 0, texts = 0, errors = 0;
  for (const char* name : kFixtures) {
    const ordered_json fx = ordered_json::parse(slurp(kDir + name + ".json"));
    const auto token = [&](const char* key) { return fx[key].is_null() ? std::string() : fx[key].get<std::string>(); };
    const ChatTemplate t = ChatTemplate::from_source(slurp(kDir + fx["template"].get<std::string>()),
                                                     token("bos_token"), token("eos_token"))
                               .with_time(fx["now_unix"].get<std::time_t>());
    for (const auto& r : fx["renders"]) {
      const ordered_json& c = conversations.at(r["conversation"]);
      const std::string what = std::string(name) + " / " + r["conversation"].get<std::string>() +
                               (r["add_generation_prompt"].get<bool>() ? " + generation prompt" : "");
      const ordered_json tools = c.contains("tools") ? c["tools"] : ordered_json(nullptr);
      const ordered_json vars = c.contains("variables") ? c["variables"] : ordered_json::object();
      ++total;
      try {
        const std::string text = t.render_json(c["messages"], r["add_generation_prompt"], tools, vars);
        if (r.contains("text")) {
          EXPECT_EQ(text, r["text"].get<std::string>()) << what;
          texts += text == r["text"].get<std::string>();
        } else {
          ADD_FAILURE() << what << ": rendered, where transformers failed with " << r["error"];
        }
      } catch (const Error& e) {
        if (r.contains("text")) ADD_FAILURE() << what << ": " << e.what();
        errors += r.contains("error");
      }
    }
  }
  std::printf(
      "chat templates: %d renders of %zu templates x %zu conversations: %d texts equal, %d errors as transformers\n",
      total, std::size(kFixtures), conversations.size(), texts, errors);
  EXPECT_EQ(texts + errors, total);
  EXPECT_GE(texts, 600);
}

TEST(ChatTemplates, BuiltinsAreTheFixtureSources) {
  const std::vector<std::string> names = ChatTemplate::builtin_names();
  EXPECT_EQ(names, (std::vector<std::string>{"chatml", "smollm2", "qwen2", "qwen2.5", "llama3", "llama3.1"}));
  for (const std::string& n : names) {
    const ChatTemplate t = ChatTemplate::named(n);
    EXPECT_EQ(t.name(), n);
    EXPECT_EQ(t.source(), slurp(kDir + "templates/" + n + ".jinja")) << n;
    // The same source given by hand is recognised, a trailing newline aside.
    std::string src = t.source();
    src = !src.empty() && src.back() == '\n' ? src.substr(0, src.size() - 1) : src + "\n";
    EXPECT_EQ(ChatTemplate::from_source(src, "", "").name(), n);
  }
  EXPECT_EQ(ChatTemplate::named("llama3.1").bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(ChatTemplate::named("qwen2.5").bos_token(), "");
  EXPECT_EQ(ChatTemplate::from_source(ChatTemplate::named("qwen2").source() + " ", "", "").name(), "custom");
  try {
    ChatTemplate::named("vicuna");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'vicuna' (have: chatml, smollm2, qwen2, qwen2.5, llama3, llama3.1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplates, ChatmlEqualsRenderChatml) {
  const ChatTemplate t = ChatTemplate::named("chatml");
  const std::vector<std::vector<ChatMessage>> chats = {
      {},
      {{"user", "Hi"}},
      {{"system", "You are helpful."}, {"user", "Hi!\nTwo lines."}, {"assistant", ""}, {"tool", "{}"}},
      {{"user", "{{ not a template }} <|im_end|> é 😀"}}};
  for (const auto& chat : chats)
    for (bool gen : {false, true}) EXPECT_EQ(t.render(chat, gen), render_chatml(chat, gen));
}

TEST(ChatTemplates, RenderJsonDropsNullKeysAndTokensMayBeAbsent) {
  const ChatTemplate t = ChatTemplate::from_source(
      "{{ bos_token is defined }}|{{ eos_token }}|{% for m in messages %}{{ m.role }}:{{ m.content is defined }}:"
      "{{ m.tool_calls|default([])|tojson }};{% endfor %}{{ tools }}|{{ add_generation_prompt }}|{{ extra }}",
      "", "</s>");
  const ordered_json msgs =
      ordered_json::parse(R"([{"role": "assistant", "content": null, "tool_calls": [{"b": 1, "a": 2}]}])");
  EXPECT_EQ(t.render_json(msgs, true, nullptr, {{"extra", 5}}),
            "False|</s>|assistant:False:[{\"b\": 1, \"a\": 2}];None|True|5");
  EXPECT_EQ(t.render({{"user", "x"}}, false), "False|</s>|user:True:[];None|False|");
  EXPECT_THROW(t.render_json(ordered_json::object(), false), Error);
  EXPECT_THROW(t.render_json(ordered_json::array({1}), false), Error);
  EXPECT_THROW(t.render_json(ordered_json::array(), false, ordered_json::object()), Error);
}

TEST(ChatTemplates, ErrorsNameTheTemplateAndPosition) {
  try {
    ChatTemplate::from_source("{% for m in messages %}\n{{ m.content | shout }}{% endfor %}", "", "");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "chat template custom:2:16: no filter named 'shout'");
  }
  const ChatTemplate gemma = ChatTemplate::from_source(slurp(kDir + "templates/gemma2.jinja"), "<bos>", "<eos>");
  try {
    gemma.render({{"system", "s"}, {"user", "u"}}, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat template custom:1:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("raised an exception: System role not supported"), std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplates, FromHuggingFaceFolder) {
  const std::string qwen = slurp(kDir + "templates/qwen2.5.jinja");
  {
    TempDir d;
    spit(d.path / "tokenizer_config.json",
         ordered_json({{"bos_token", nullptr}, {"eos_token", "<|im_end|>"}, {"chat_template", qwen}}).dump());
    const ChatTemplate t = ChatTemplate::from_hf_folder(d.path.string());
    EXPECT_EQ(t.name(), "qwen2.5");
    EXPECT_EQ(t.eos_token(), "<|im_end|>");
    EXPECT_EQ(t.render({{"user", "Hi"}}, true),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  }
  {  // the list form (named templates) and added-token objects for the tokens
    TempDir d;
    const ordered_json list = ordered_json::array(
        {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "{{ bos_token }}D"}}});
    spit(d.path / "tokenizer_config.json",
         ordered_json({{"bos_token", {{"content", "<s>"}, {"lstrip", false}}}, {"chat_template", list}}).dump());
    EXPECT_EQ(ChatTemplate::from_hf_folder(d.path.string()).render({}, false), "<s>D");
    spit(d.path / "chat_template.jinja", "{{ bos_token }}J\n");  // the file wins
    EXPECT_EQ(ChatTemplate::from_hf_folder(d.path.string()).render({}, false), "<s>J");
  }
  {
    TempDir d;
    EXPECT_THROW(ChatTemplate::from_hf_folder(d.path.string()), Error);
    spit(d.path / "tokenizer_config.json", R"({"chat_template": 5})");
    EXPECT_THROW(ChatTemplate::from_hf_folder(d.path.string()), Error);
    spit(d.path / "tokenizer_config.json", R"({"chat_template": "x", "bos_token": [1]})");
    EXPECT_THROW(ChatTemplate::from_hf_folder(d.path.string()), Error);
  }
}

// SmolLM2-135M-Instruct's GGUF (tools/get_model.sh smollm2) carries the built-in "smollm2".
TEST(ChatTemplates, SmolLM2GgufCarriesTheBuiltinTemplate) {
  const char* home = std::getenv("HOME");
  const fs::path gguf =
      fs::path(home != nullptr ? home : "") / ".cache/worldmem/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is not there (tools/get_model.sh smollm2 fetches it)";
  const GgufFile f = GgufFile::open(gguf.string());
  const ChatTemplate t =
      ChatTemplate::from_source(f.get_string("tokenizer.chat_template"), "<|im_start|>", "<|im_end|>");
  EXPECT_EQ(t.name(), "smollm2");
  EXPECT_EQ(t.render({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace wm::llm::chat_template_test
