// libFuzzer target: the Jinja interpreter of the chat templates (llmkv/jinja.h) on arbitrary
// template text, rendered with a chat that has a system message, turns, a tool call and tools,
// under tight limits. Property: parsing and rendering either give text or throw wm::Error; any
// other exception, a crash, a sanitizer report or a hang past -timeout is a finding.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "llmkv/jinja.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace fuzz_jinja {

const nlohmann::ordered_json& variables() {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Zürich? {{ not a template }} 😀"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
        "arguments": {"city": "Zürich", "days": 2, "ratio": 0.5, "ok": true}}}]},
      {"role": "tool", "content": "{\"temperature\": 21.5}"},
      {"role": "assistant", "content": "  21.5 °C\n"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })");
  return vars;
}

WM_FUZZ_TARGET(jinja) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  wm::llm::jinja::Limits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  limits.max_items = 1 << 16;
  wm::llm::jinja::RenderOptions options;
  options.now = 1721995200;
  try {
    (void)wm::llm::jinja::Template::parse(source, "fuzz", limits).render(variables(), options);
  } catch (const wm::Error&) {
    // refusing the template, or failing to render it, is the expected outcome of bad input
  }
  return 0;
}

}  // namespace fuzz_jinja
