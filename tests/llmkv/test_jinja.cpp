// The Jinja interpreter (llmkv/jinja.h): each construct, filter family, test and method set
// against jinja2's own rendering (tests/llmkv/fixtures/chat_templates/interpreter_cases.json, made
// by tools/chat_template_fixtures/make_fixtures.py with transformers' environment); whitespace
// control; errors naming line and column; the limits a hostile template meets; random damage to
// real templates never crashing.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "llmkv/jinja.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"

namespace wm::llm::jinja_test {

using nlohmann::ordered_json;
using wm::llm::jinja::Limits;
using wm::llm::jinja::RenderOptions;
using wm::llm::jinja::Template;

const std::string kDir = std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/chat_templates/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string render(const std::string& source, const ordered_json& vars = ordered_json::object(), Limits limits = {}) {
  return Template::parse(source, "t", limits).render(vars);
}

// The wm::Error message of parsing and rendering source ("" when it renders).
std::string error_of(const std::string& source, const ordered_json& vars = ordered_json::object(), Limits limits = {}) {
  try {
    render(source, vars, limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Jinja, ConstructsRenderAsJinja2Does) {
  const ordered_json doc = ordered_json::parse(slurp(kDir + "interpreter_cases.json"));
  int texts = 0, errors = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"], source = c["template"];
    if (c.contains("text")) {
      try {
        EXPECT_EQ(render(source, doc["variables"]), c["text"].get<std::string>()) << name << ": " << source;
        ++texts;
      } catch (const Error& e) {
        ADD_FAILURE() << name << ": " << e.what();
      }
    } else {
      EXPECT_NE(error_of(source, doc["variables"]), "") << name << " renders, jinja2 failed with " << c["error"];
      ++errors;
    }
  }
  std::printf("interpreter cases: %d texts and %d errors as jinja2\n", texts, errors);
  EXPECT_GE(texts, 45);
  EXPECT_GE(errors, 10);
}

TEST(Jinja, WhitespaceControlAsTransformersSetsIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indent before one goes.
  EXPECT_EQ(render("{% if true %}\nA\n{% endif %}\nB"), "A\nB");
  EXPECT_EQ(render("x\n    {% if true %}\n    y\n    {% endif %}\nz"), "x\n    y\nz");
  // "-" strips every whitespace on its side, newlines included; "+" keeps them.
  EXPECT_EQ(render("a  {{- 'b' -}}  c\n  {%- if true %} d {% endif -%}  \n e"), "abc d e");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif +%}\nc"), "a\n  b\nc");
  // lstrip_blocks leaves {{ }} alone; comments go with their line.
  EXPECT_EQ(render("  {{ 'v' }}\n  {% if true %}w{% endif %}"), "  v\nw");
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
  // \r\n becomes \n, one final newline is dropped.
  EXPECT_EQ(render("a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\n"), "a\nb\nc");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  // Unicode spaces count as whitespace for "-", as Python's str.rstrip has it.
  EXPECT_EQ(render("a\u3000\u00a0 {{- 'b' }}"), "ab");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("line one\n  {{ x | nosuch }}"), "t:2:10: no filter named 'nosuch'");
  EXPECT_EQ(error_of("{{ x | round }}"), "t:1:8: the filter 'round' is not supported by this interpreter");
  EXPECT_EQ(error_of("{{ x is nosuch }}"), "t:1:6: no test named 'nosuch'");
  EXPECT_EQ(error_of("ab\n{% include 'x.j2' %}"), "t:2:1: '{% include %}' is not supported by this interpreter");
  EXPECT_EQ(error_of("{% for x in y %}{{ x }}"), "t:1:24: unexpected end of template: looking for 'endfor' or 'else'");
  EXPECT_EQ(error_of("{% frobnicate %}"), "t:1:1: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("{% if x %}{% endfor %}{% endif %}"),
            "t:1:11: unknown tag 'endfor' (expected 'elif' or 'else' or 'endif')");
  EXPECT_EQ(error_of("{{ 'abc }}"), "t:1:4: unterminated string literal");
  EXPECT_EQ(error_of("{{ (1 }}"), "t:1:7: unexpected '}', expected ')'");
  EXPECT_EQ(error_of("{{ }}"), "t:1:4: expected an expression, got '}}'");
  EXPECT_EQ(error_of("é{{ 1 +* 2 }}"), "t:1:8: unexpected '*'");  // columns count code points
  EXPECT_EQ(error_of("{# never closed"), "t:1:1: missing end of comment tag ('#}')");
  EXPECT_EQ(error_of("{% raw %} never closed"), "t:1:1: missing end of raw directive ({% endraw %})");
  EXPECT_EQ(error_of("{{ x"), "t:1:1: unclosed tag: missing '}}'");
  EXPECT_EQ(error_of("{% break %}"), "t:1:1: 'break' outside a loop");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"),
            "t:1:15: recursive loops are not supported by this interpreter");
  EXPECT_EQ(error_of("{{ f(*a) }}"), "t:1:6: *args and **kwargs in calls are not supported by this interpreter");
  EXPECT_EQ(error_of("{{ '\\x4' }}"), "t:1:4: truncated \\xXX escape");
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"), "t:1:4: integer literal too large (ints are 64-bit here)");
  EXPECT_EQ(error_of("{% macro m(a=1, b) %}{% endmacro %}"),
            "t:1:18: a macro parameter without a default follows one with a default");
}

TEST(Jinja, RenderErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("line1\n  {{ raise_exception('boom: ' ~ 42) }}"),
            "t:2:6: the template raised an exception: boom: 42");
  EXPECT_EQ(error_of("{{ missing.x }}"), "t:1:11: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ m.a.b }}", {{"m", ordered_json::object()}}), "t:1:7: 'dict object' has no attribute 'a'");
  EXPECT_EQ(error_of("{{ messages[0]['role'] }}", {{"messages", ordered_json::array()}}),
            "t:1:15: list index out of range");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"), "t:1:6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "t:1:6: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "t:1:24: integer overflow (this interpreter's ints are 64-bit)");
  EXPECT_EQ(error_of("{% for a, b in [[1]] %}{% endfor %}"), "t:1:1: not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(error_of("{{ xs.append(1) }}", {{"xs", ordered_json::array()}}),
            "t:1:6: the method 'append' of 'list' objects is not supported here");
  EXPECT_EQ(error_of("{{ range(100001)|length }}"),
            "t:1:4: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_EQ(error_of("{{ x|tojson }}"), "t:1:6: Object of type Undefined is not JSON serializable");
  // Undefined values print empty, test false and iterate empty, as Jinja's default Undefined.
  EXPECT_EQ(render("[{{ x }}]{{ x is defined }}{% for i in x %}no{% endfor %}{{ x|default('d') }}"), "[]Falsed");
}

TEST(Jinja, LimitsStopHostileTemplates) {
  Limits small;
  small.max_output_bytes = 1000;
  EXPECT_NE(error_of("{% for i in range(1000) %}0123456789{% endfor %}", {}, small).find("limit of 1000 bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{% set s = namespace(v='ab') %}{% for i in range(20) %}{% set s.v = s.v + s.v %}{% endfor %}", {},
                     small)
                .find("limit of 1000 bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'ab' * 100000 }}", {}, small).find("limit of 1000 bytes"), std::string::npos);
  Limits steps;
  steps.max_steps = 100000;
  EXPECT_NE(error_of("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", {}, steps)
                .find("limit of 100000 evaluation steps"),
            std::string::npos);
  // Infinite recursion stops at the depth limit, as Python's RecursionError would.
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("passes the limit of"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(200) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("passes the limit of"),
            std::string::npos);
  EXPECT_NE(
      error_of("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("nests deeper than the limit"),
      std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(500, '-') + "1 }}").find("nests deeper than the limit"), std::string::npos);
  EXPECT_NE(error_of(std::string(2000, 'x'), {}, Limits{1000}).find("over the limit of 1000"), std::string::npos);
  Limits items;
  items.max_items = 1000;
  EXPECT_NE(error_of("{{ ([1] * 5000)|length }}", {}, items).find("limit of 1000"), std::string::npos);
  // The same templates within the limits render.
  EXPECT_EQ(render("{% for i in range(3) %}{% for j in range(3) %}.{% endfor %}{% endfor %}", {}, steps), ".........");
}

TEST(Jinja, StrftimeNowFormatsTheGivenTime) {
  RenderOptions at;
  at.now = 1721995200;  // 2024-07-26 12:00 UTC: 26 Jul 2024 in every zone within +-11 h
  EXPECT_EQ(Template::parse("{{ strftime_now('%d %b %Y') }}").render(ordered_json::object(), at), "26 Jul 2024");
  EXPECT_EQ(Template::parse("{{ strftime_now('%Y') }}").render(ordered_json::object(), at), "2024");
}

TEST(Jinja, VariablesKeepJsonKeyOrder) {
  const ordered_json vars = ordered_json::parse(R"({"d": {"zeta": 1, "alpha": [1.0, 2.5e-7, null], "mid": "é"}})");
  EXPECT_EQ(
      render("{{ d|tojson }}|{{ d }}|{{ d|tojson(indent=2) }}", vars),
      "{\"zeta\": 1, \"alpha\": [1.0, 2.5e-07, null], \"mid\": \"é\"}|{'zeta': 1, 'alpha': [1.0, 2.5e-07, None], "
      "'mid': 'é'}|{\n  \"zeta\": 1,\n  \"alpha\": [\n    1.0,\n    2.5e-07,\n    null\n  ],\n  \"mid\": \"é\"\n}");
}

TEST(Jinja, FloatsPrintAsPythonRepr) {
  using wm::llm::jinja::float_repr;
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(float_repr(1e-5), "1e-05");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(-0.0), "-0.0");
  EXPECT_EQ(float_repr(5e-324), "5e-324");
  EXPECT_EQ(float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(float_repr(2.5), "2.5");
}

// Random damage to the fixture templates (bytes replaced, inserted, dropped, pieces of Jinja
// syntax spliced in): parsing and rendering each either works or throws wm::Error.
TEST(Jinja, DamagedTemplatesFailCleanly) {
  const char* const files[] = {"qwen2.5", "llama3.1", "hermes2pro", "qwen3", "mistral-nemo"};
  const char* const pieces[] = {"{{",   "}}",    "{%", "%}", "{#", "#}",   "-",     "(",        ")",
                                "[",    "]",     "'",  "\"", "|",  " if ", " for ", " endfor ", " set ",
                                " is ", " not ", "~",  "**", ".",  ",",    "\\"};
  const ordered_json conv = ordered_json::parse(slurp(kDir + "conversations.json"));
  std::mt19937 rng(1234);
  int rendered = 0, refused = 0;
  for (const char* name : files) {
    const std::string base = slurp(kDir + "templates/" + name + ".jinja");
    for (int trial = 0; trial < 300; ++trial) {
      std::string s = base;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        const size_t at = rng() % s.size();
        switch (rng() % 4) {
          case 0:
            s[at] = static_cast<char>(rng() % 256);
            break;
          case 1:
            s.insert(at, pieces[rng() % std::size(pieces)]);
            break;
          case 2:
            s.erase(at, 1 + rng() % 8);
            break;
          default:
            s.insert(at, s.substr(rng() % s.size(), 1 + rng() % 40));
        }
      }
      ordered_json vars = {{"messages", conv[rng() % conv.size()]["messages"]},
                           {"add_generation_prompt", true},
                           {"bos_token", "<s>"},
                           {"tools", conv[20]["tools"]}};
      try {
        Limits l;
        l.max_steps = 200000;
        Template::parse(s, "t", l).render(vars);
        ++rendered;
      } catch (const Error&) {
        ++refused;
      }
    }
  }
  std::printf("damaged templates: %d rendered, %d refused with wm::Error\n", rendered, refused);
  EXPECT_GT(rendered, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace wm::llm::jinja_test
