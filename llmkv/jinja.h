#pragma once
// A Jinja2 interpreter for chat templates: the subset that Hugging Face chat templates use,
// rendering as Python's jinja2 does with the environment transformers builds for them
// (ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension,
// its own tojson, raise_exception, strftime_now, namespace and dict), byte for byte.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (-, +), {% raw %}; if / elif / else; for
// with else, an `if` filter, unpacking, loop.index / index0 / revindex / revindex0 / first /
// last / length / previtem / nextitem / cycle(), break / continue; set (names, unpacking,
// namespace attributes, block set with filters); macro (positional, keyword and default
// arguments, recursion); {% filter %}; transformers' {% generation %} (output as it is).
// Expressions: literals (str with Python escapes, int, float, true / false / none, list,
// tuple, dict), + - * / // % ** ~, comparisons (chained), and / or / not, in / not in,
// `a if c else b`, attributes, subscripts, slices, calls; the filters and tests of
// jinja_builtins.cpp; str methods (strip, split, startswith, replace, format, ...) and dict
// methods (items, keys, values, get).
// Refused with a wm::Error naming the line and column: include / import / extends / block /
// call / with / autoescape, recursive loops, *args / **kwargs, the Jinja filters this
// interpreter lacks (round, truncate, groupby, ...), a list's or dict's mutating methods (as the
// sandbox refuses them).
// Hostile templates: the template's size, the output's size, every string built, the elements
// of a list, the evaluation steps (loop iterations included) and the nesting (parsing, macro
// calls, nested lists) are bounded by Limits; passing one is a wm::Error, never a crash.
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "llmkv/jinja_value.h"

namespace wm::llm::jinja {

struct RenderOptions {
  // The time strftime_now() formats (local time); now when unset.
  std::optional<std::time_t> now;
};

class Template {
 public:
  // Parses source (newlines normalised, one trailing newline dropped, as Jinja does). name
  // prefixes errors: "name:line:column: message". Throws wm::Error on a syntax error, an
  // unknown filter or test, a refused construct, or a source larger than limits.max_source_bytes.
  static Template parse(const std::string& source, std::string name = "template", Limits limits = {});

  // The text for these variables (a JSON object: each key a variable; objects keep their key
  // order with ordered_json; null: none). raise_exception, range, namespace, dict and strftime_now are
  // defined unless a variable of that name replaces them. Throws wm::Error
  // "name:line:column: message" when rendering fails (raise_exception, an undefined value used
  // where Python fails, a type error, a limit passed).
  std::string render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;

  const std::string& name() const;
  // The source after newline normalisation (error positions refer to it).
  const std::string& source() const;

 private:
  struct Program;
  std::shared_ptr<const Program> program_;
};

}  // namespace wm::llm::jinja
