#include <algorithm>
#include <initializer_list>

#include "llmkv/jinja_ast.h"
#include "llmkv/jinja_builtins.h"

namespace wm::llm::jinja {
namespace parser_impl {

ExprPtr make_expr(Expr::Kind kind, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

ExprPtr make_binary(Expr::Kind kind, size_t pos, std::string name, ExprPtr a, ExprPtr b) {
  ExprPtr e = make_expr(kind, pos);
  e->name = std::move(name);
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return e;
}

std::unique_ptr<Node> make_node(Node::Kind kind, size_t pos) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

using Names = std::initializer_list<const char*>;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const Limits& limits) : t_(tokens), limits_(limits) {}

  Body run() {
    Body body;
    subparse(body, {});
    return body;
  }

 private:
  const std::vector<Token>& t_;
  const Limits& limits_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;

  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_depth)
        p.error("the template nests deeper than the limit of " + std::to_string(p.limits_.max_depth));
    }
    ~Nest() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  bool is_op(const char* o) const { return cur().type == Tok::Op && cur().text == o; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool is_name_in(Names names) const {
    for (const char* n : names)
      if (is_name(n)) return true;
    return false;
  }
  bool skip_op(const char* o) { return is_op(o) ? (++i_, true) : false; }
  bool skip_name(const char* n) { return is_name(n) ? (++i_, true) : false; }

  [[noreturn]] void error(const std::string& message) const { throw SyntaxFailure{cur().pos, message}; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Data:
        return "template text";
      case Tok::VarBegin:
        return "'{{'";
      case Tok::VarEnd:
        return "'}}'";
      case Tok::BlockBegin:
        return "'{%'";
      case Tok::BlockEnd:
        return "'%}'";
      case Tok::Name:
      case Tok::Op:
        return "'" + t.text + "'";
      case Tok::String:
        return "a string";
      case Tok::Int:
      case Tok::Float:
        return "a number";
      case Tok::End:
        return "the end of the template";
    }
    return "?";
  }

  void expect_op(const char* o) {
    if (!skip_op(o)) error(std::string("expected '") + o + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error("expected a name, got " + describe(cur()));
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error("expected '%}', got " + describe(cur()));
    ++i_;
  }

  // Nodes into out until a block tag named in ends; returns that name (its tag's name consumed),
  // or "" at the end of the template when ends is empty.
  std::string subparse(Body& out, Names ends) {
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        auto n = make_node(Node::Kind::Text, t.pos);
        n->text = t.text;
        out.push_back(std::move(n));
        ++i_;
      } else if (t.type == Tok::VarBegin) {
        ++i_;
        auto n = make_node(Node::Kind::Output, t.pos);
        n->exprs.push_back(parse_tuple(true, {}, false));
        if (cur().type != Tok::VarEnd) error("expected '}}', got " + describe(cur()));
        ++i_;
        out.push_back(std::move(n));
      } else if (t.type == Tok::BlockBegin) {
        ++i_;
        if (cur().type != Tok::Name) error("expected a tag name after '{%', got " + describe(cur()));
        for (const char* e : ends)
          if (is_name(e)) return t_[i_++].text;
        out.push_back(statement(ends));
      } else if (t.type == Tok::End) {
        if (ends.size() == 0) return "";
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "'" : " or '") + e + "'";
        error("unexpected end of template: looking for " + want);
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Node> statement(Names ends) {
    Nest nest(*this);
    const size_t pos = t_[i_ - 1].pos;
    const std::string tag = expect_name();
    if (tag == "if") return parse_if(pos);
    if (tag == "for") return parse_for(pos);
    if (tag == "set") return parse_set(pos);
    if (tag == "macro") return parse_macro(pos);
    if (tag == "filter") return parse_filter_block(pos);
    if (tag == "generation") {
      auto n = make_node(Node::Kind::Generation, pos);
      expect_block_end();
      n->bodies.emplace_back();
      subparse(n->bodies[0], {"endgeneration"});
      expect_block_end();
      return n;
    }
    if (tag == "break" || tag == "continue") {
      if (loops_ == 0) throw SyntaxFailure{pos, "'" + tag + "' outside a loop"};
      expect_block_end();
      return make_node(tag == "break" ? Node::Kind::Break : Node::Kind::Continue, pos);
    }
    static const Names kRefused = {"call", "include",    "import", "from",  "extends",  "block",
                                   "with", "autoescape", "do",     "trans", "pluralize"};
    for (const char* r : kRefused)
      if (tag == r) throw SyntaxFailure{pos, "'{% " + tag + " %}' is not supported by this interpreter"};
    std::string hint;
    for (const char* e : ends) hint += std::string(hint.empty() ? " (expected '" : " or '") + e + "'";
    throw SyntaxFailure{pos, "unknown tag '" + tag + "'" + (hint.empty() ? "" : hint + ")")};
  }

  std::unique_ptr<Node> parse_if(size_t pos) {
    auto n = make_node(Node::Kind::If, pos);
    n->exprs.push_back(parse_tuple(false, {}, false));
    expect_block_end();
    while (true) {
      n->bodies.emplace_back();
      const std::string end = subparse(n->bodies.back(), {"elif", "else", "endif"});
      if (end == "elif") {
        n->exprs.push_back(parse_tuple(false, {}, false));
        expect_block_end();
        continue;
      }
      expect_block_end();
      if (end == "else") {
        n->bodies.emplace_back();
        subparse(n->bodies.back(), {"endif"});
        expect_block_end();
      }
      return n;
    }
  }

  // Names assigned by for / set: a name, or several separated by commas, maybe in parentheses.
  std::vector<std::string> assign_names() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do names.push_back(expect_name());
    while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  std::unique_ptr<Node> parse_for(size_t pos) {
    auto n = make_node(Node::Kind::For, pos);
    n->targets = assign_names();
    if (!skip_name("in")) error("expected 'in' in a for loop, got " + describe(cur()));
    n->exprs.push_back(parse_tuple(false, {"recursive"}, false));
    if (skip_name("if")) n->exprs.push_back(parse_expression(true));
    if (is_name("recursive")) error("recursive loops are not supported by this interpreter");
    expect_block_end();
    n->bodies.emplace_back();
    ++loops_;
    const std::string end = subparse(n->bodies[0], {"endfor", "else"});
    --loops_;
    n->bodies.emplace_back();
    if (end == "else") {
      expect_block_end();
      subparse(n->bodies[1], {"endfor"});
    }
    expect_block_end();
    return n;
  }

  std::unique_ptr<Node> parse_set(size_t pos) {
    auto n = make_node(Node::Kind::Set, pos);
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      n->targets.push_back(expect_name());
      ++i_;
      n->targets.push_back(expect_name());
      n->namespace_attr = true;
    } else {
      n->targets = assign_names();
    }
    if (skip_op("=")) {
      n->exprs.push_back(parse_tuple(true, {}, false));
      expect_block_end();
      return n;
    }
    if (n->targets.size() > 1 && !n->namespace_attr) error("a block set assigns one name");
    n->kind = Node::Kind::SetBlock;
    if (is_op("|")) n->exprs.push_back(filter_chain(nullptr, false));
    expect_block_end();
    n->bodies.emplace_back();
    subparse(n->bodies[0], {"endset"});
    expect_block_end();
    return n;
  }

  std::unique_ptr<Node> parse_macro(size_t pos) {
    auto n = make_node(Node::Kind::Macro, pos);
    n->targets.push_back(expect_name());
    expect_op("(");
    while (!is_op(")")) {
      if (n->targets.size() > 1) expect_op(",");
      if (is_op(")")) break;
      n->targets.push_back(expect_name());
      n->exprs.push_back(skip_op("=") ? parse_expression(true) : nullptr);
      if (!n->exprs.back() && n->exprs.size() > 1 && n->exprs[n->exprs.size() - 2])
        error("a macro parameter without a default follows one with a default");
    }
    expect_op(")");
    expect_block_end();
    n->bodies.emplace_back();
    const int loops = loops_;
    loops_ = 0;
    subparse(n->bodies[0], {"endmacro"});
    loops_ = loops;
    expect_block_end();
    return n;
  }

  std::unique_ptr<Node> parse_filter_block(size_t pos) {
    auto n = make_node(Node::Kind::FilterBlock, pos);
    n->exprs.push_back(filter_chain(nullptr, true));
    expect_block_end();
    n->bodies.emplace_back();
    subparse(n->bodies[0], {"endfilter"});
    expect_block_end();
    return n;
  }

  // ---- expressions ----

  bool is_tuple_end(Names extra) const {
    const Tok t = cur().type;
    return t == Tok::VarEnd || t == Tok::BlockEnd || t == Tok::End || is_op(")") || is_name_in(extra);
  }

  ExprPtr parse_tuple(bool with_condexpr, Names extra_end, bool explicit_parens) {
    const size_t pos = cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (!is_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error("expected an expression, got " + describe(cur()));
    }
    ExprPtr e = make_expr(Expr::Kind::Tuple, pos);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    Nest nest(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const size_t pos = t_[i_++].pos;
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      ExprPtr c = make_expr(Expr::Kind::Cond, pos);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t pos = t_[i_++].pos;
      e = make_binary(Expr::Kind::Or, pos, "or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t pos = t_[i_++].pos;
      e = make_binary(Expr::Kind::And, pos, "and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    Nest nest(*this);
    ExprPtr e = make_expr(Expr::Kind::Unary, t_[i_++].pos);
    e->name = "not";
    e->args.push_back(parse_not());
    return e;
  }

  ExprPtr parse_compare() {
    const size_t pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr e;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = t_[i_++].text;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!e) {
        e = make_expr(Expr::Kind::Compare, pos);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->args.push_back(parse_math1());
    }
    return e ? std::move(e) : std::move(first);
  }

  template <class Next>
  ExprPtr binary_level(Names ops, Next next) {
    ExprPtr e = (this->*next)();
    while (cur().type == Tok::Op &&
           std::any_of(ops.begin(), ops.end(), [&](const char* o) { return cur().text == o; })) {
      const Token& t = t_[i_++];
      e = make_binary(Expr::Kind::Binary, t.pos, t.text, std::move(e), (this->*next)());
    }
    return e;
  }

  ExprPtr parse_math1() { return binary_level({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_math2() { return binary_level({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return binary_level({"**"}, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_concat() {
    const size_t pos = cur().pos;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    ExprPtr e = make_expr(Expr::Kind::Concat, pos);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make_expr(Expr::Kind::Unary, cur().pos);
      e->name = t_[i_++].text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    ExprPtr e = make_expr(Expr::Kind::Const, t.pos);
    if (t.type == Tok::Name) {
      ++i_;
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False")
        e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
      else if (t.text == "none" || t.text == "None")
        e->value = Value::none();
      else
        e->kind = Expr::Kind::Name, e->name = t.text;
    } else if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += t_[i_++].text;
      e->value = Value::string(std::move(s));
    } else if (t.type == Tok::Int) {
      e->value = Value::integer(t_[i_++].int_value);
    } else if (t.type == Tok::Float) {
      e->value = Value::number(t_[i_++].float_value);
    } else if (skip_op("(")) {
      e = parse_tuple(true, {}, true);
      expect_op(")");
    } else if (is_op("[") || is_op("{")) {
      return parse_list_or_dict();
    } else {
      error("unexpected " + describe(t));
    }
    return e;
  }

  ExprPtr parse_list_or_dict() {
    const bool dict = is_op("{");
    const char* close = dict ? "}" : "]";
    ExprPtr e = make_expr(dict ? Expr::Kind::Dict : Expr::Kind::List, t_[i_++].pos);
    while (!is_op(close)) {
      if (!e->args.empty()) expect_op(",");
      if (is_op(close)) break;
      e->args.push_back(parse_expression(true));
      if (dict) {
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
    }
    expect_op(close);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("["))
        e = parse_subscript(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|"))
        e = filter_chain(std::move(e), false);
      else if (is_name("is"))
        e = parse_test(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& t = t_[i_++];
    if (t.text == ".") {
      if (cur().type == Tok::Name) {
        ExprPtr e = make_expr(Expr::Kind::Attr, t.pos);
        e->name = t_[i_++].text;
        e->args.push_back(std::move(obj));
        return e;
      }
      if (cur().type != Tok::Int) error("expected a name or a number after '.', got " + describe(cur()));
      ExprPtr key = make_expr(Expr::Kind::Const, cur().pos);
      key->value = Value::integer(t_[i_++].int_value);
      return make_binary(Expr::Kind::Item, t.pos, "", std::move(obj), std::move(key));
    }
    std::vector<ExprPtr> keys;
    while (!is_op("]")) {
      if (!keys.empty()) expect_op(",");
      keys.push_back(parse_subscribed());
    }
    expect_op("]");
    if (keys.empty()) error("expected a subscript inside '[]'");
    if (keys.size() == 1 && keys[0]->kind == Expr::Kind::Slice) {
      keys[0]->args[0] = std::move(obj);
      return std::move(keys[0]);
    }
    if (keys.size() == 1) return make_binary(Expr::Kind::Item, t.pos, "", std::move(obj), std::move(keys[0]));
    for (const ExprPtr& k : keys)
      if (k->kind == Expr::Kind::Slice)
        throw SyntaxFailure{k->pos, "several slices in one subscript are not supported"};
    ExprPtr key = make_expr(Expr::Kind::Tuple, t.pos);
    key->args = std::move(keys);
    return make_binary(Expr::Kind::Item, t.pos, "", std::move(obj), std::move(key));
  }

  ExprPtr parse_subscribed() {
    const size_t pos = cur().pos;
    ExprPtr start;
    if (!skip_op(":")) {
      start = parse_expression(true);
      if (!skip_op(":")) return start;
    }
    ExprPtr e = make_expr(Expr::Kind::Slice, pos);
    e->args.push_back(nullptr);
    e->args.push_back(std::move(start));
    e->args.push_back(is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression(true));
    ExprPtr step;
    if (skip_op(":") && !is_op("]") && !is_op(",")) step = parse_expression(true);
    e->args.push_back(std::move(step));
    return e;
  }

  // "(" arguments ")" into e: positional ones appended to e->args, keyword ones to e->kwargs.
  void call_args(Expr& e) {
    expect_op("(");
    bool any = false;
    while (!is_op(")")) {
      if (any) expect_op(",");
      if (is_op(")")) break;
      any = true;
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported by this interpreter");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make_expr(Expr::Kind::Call, callee->pos);
    e->args.push_back(std::move(callee));
    call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    return name;
  }

  // "| f(args) | g ..." on e (null in a filter block or block set); start_inline: the first
  // filter's name comes without a "|" ({% filter upper %}).
  ExprPtr filter_chain(ExprPtr e, bool start_inline) {
    while (start_inline || is_op("|")) {
      if (!start_inline) ++i_;
      start_inline = false;
      ExprPtr f = make_expr(Expr::Kind::Filter, cur().pos);
      f->name = dotted_name();
      if (!has_filter(f->name)) throw SyntaxFailure{f->pos, missing_filter_message(f->name)};
      f->args.push_back(std::move(e));
      if (is_op("(")) call_args(*f);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr e) {
    ExprPtr t = make_expr(Expr::Kind::Test, t_[i_++].pos);
    t->negated = skip_name("not");
    t->name = dotted_name();
    if (!has_test(t->name)) throw SyntaxFailure{t->pos, missing_test_message(t->name)};
    t->args.push_back(std::move(e));
    const Tok k = cur().type;
    if (is_op("(")) {
      call_args(*t);
    } else if ((k == Tok::Name || k == Tok::String || k == Tok::Int || k == Tok::Float || is_op("[") || is_op("{")) &&
               !is_name_in({"else", "or", "and"})) {
      if (is_name("is")) error("tests cannot be chained with 'is'");
      t->args.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }
};

}  // namespace parser_impl

Body parse(const std::vector<Token>& tokens, const Limits& limits) { return parser_impl::Parser(tokens, limits).run(); }

}  // namespace wm::llm::jinja
