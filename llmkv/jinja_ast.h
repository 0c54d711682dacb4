#pragma once
// The syntax tree of a Jinja template (llmkv/jinja.h) and its parser, which follows Jinja's own
// grammar and precedence: `a if c else b`, or, and, not, comparisons (chained, in, not in),
// + -, ~, * / // %, ** (left to right, as Jinja has it), unary - +, then postfix `.attr`, `[i]`,
// `[a:b:c]`, calls, `| filter` and `is test` (a filter binds tighter than any operator:
// `'a' + s | trim` trims s alone).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llmkv/jinja_lexer.h"
#include "llmkv/jinja_value.h"

namespace wm::llm::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    Const,    // value
    Name,     // name
    List,     // [args...]
    Tuple,    // (args...)
    Dict,     // {args[0]: args[1], args[2]: args[3], ...}
    Attr,     // args[0].name
    Item,     // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]], a part left out is null
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs); args[0] is null in {% filter %} and {% set x | f %}
    Test,     // args[0] is [not] name(args[1..]); negated for `is not`
    Unary,    // name ("-", "+", "not") applied to args[0]
    Binary,   // args[0] name args[1], name one of + - * / // % **
    And,      // args[0] and args[1]
    Or,       // args[0] or args[1]
    Concat,   // args joined as text (~)
    Compare,  // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    Cond,     // args[0] if args[1] else args[2] (null: undefined)
  };
  Kind kind;
  size_t pos;  // byte offset in the normalised source
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind : uint8_t {
    Text,         // text
    Output,       // {{ exprs[0] }}
    If,           // if exprs[i]: bodies[i] ...; a last bodies entry past exprs is the else branch
    For,          // for targets in exprs[0] [if exprs[1]]: bodies[0], else bodies[1]
    Set,          // targets = exprs[0] (several targets unpack); namespace_attr: targets {ns, attribute}
    SetBlock,     // targets = the output of bodies[0], through the filter chain exprs[0] when present
    Macro,        // macro targets[0](targets[1..]) with defaults exprs[i] (null: none): bodies[0]
    FilterBlock,  // the output of bodies[0] through the filter chain exprs[0]
    Break,
    Continue,
    Generation,  // transformers' {% generation %}: bodies[0], output as it is
  };
  Kind kind;
  size_t pos;
  std::string text;
  std::vector<std::string> targets;
  bool namespace_attr = false;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
};

// The template's body from its tokens (tokenize). Throws SyntaxFailure: an unknown or unclosed
// tag, an unknown filter or test, a construct this interpreter refuses (include, import, extends,
// block, call, with, recursive loops, *args), nesting past limits.max_depth.
Body parse(const std::vector<Token>& tokens, const Limits& limits);

}  // namespace wm::llm::jinja
