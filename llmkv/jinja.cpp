#include "llmkv/jinja.h"

#include "llmkv/jinja_ast.h"
#include "llmkv/jinja_builtins.h"
#include "llmkv/jinja_lexer.h"
#include "llmkv/jinja_text.h"
#include "runtime/error.h"

namespace wm::llm::jinja {

struct Template::Program {
  std::string name;
  std::string source;
  Limits limits;
  Body body;
};

namespace render_impl {

// A failure at a byte offset of the source, on its way to the wm::Error that names line and column.
struct PositionedFailure {
  size_t pos;
  std::string message;
};

std::string where(const std::string& name, const std::string& source, size_t pos) {
  pos = std::min(pos, source.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i)
    if (source[i] == '\n') ++line, line_start = i + 1;
  const size_t column = 1 + text::code_point_count(std::string_view(source).substr(line_start, pos - line_start));
  return name + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
}

// Variables of one frame: the render's variables, a loop iteration, a macro call. A name set in
// a frame stays in it (Jinja's scoping: a set inside a loop body is gone after the iteration).
struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get())
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const Body& body, Guard& guard, std::shared_ptr<Scope> root,
           std::vector<std::pair<std::string, Value>> globals)
      : body_(body), guard_(guard), scope_(std::move(root)), globals_(std::move(globals)) {}

  std::string run() {
    std::string out;
    out_ = &out;
    exec(body_);
    return out;
  }

 private:
  const Body& body_;
  Guard& guard_;
  std::shared_ptr<Scope> scope_;
  std::vector<std::pair<std::string, Value>> globals_;
  std::string* out_ = nullptr;
  int calls_ = 0;

  // Runs f with scope_ set to s and out_ to buf (when given), restoring both after.
  template <class F>
  auto within(std::shared_ptr<Scope> s, std::string* buf, F f) {
    struct Restore {
      Renderer& r;
      std::shared_ptr<Scope> scope;
      std::string* out;
      ~Restore() {
        r.scope_ = std::move(scope);
        r.out_ = out;
      }
    } restore{*this, scope_, out_};
    scope_ = std::move(s);
    if (buf != nullptr) out_ = buf;
    return f();
  }

  std::shared_ptr<Scope> child_scope() const {
    auto s = std::make_shared<Scope>();
    s->parent = scope_;
    return s;
  }

  Flow exec(const Body& body) {
    for (const auto& n : body) {
      const Flow f = exec_node(*n);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& n) {
    try {
      guard_.step();
      return exec_inner(n);
    } catch (const Failure& f) {
      throw PositionedFailure{n.pos, f.message};
    }
  }

  Flow exec_inner(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Text:
        out_->append(n.text);
        guard_.check_size(out_->size());
        return Flow::Normal;
      case Node::Kind::Output:
        append_str(*out_, eval(*n.exprs[0]), guard_);
        return Flow::Normal;
      case Node::Kind::If:
        for (size_t i = 0; i < n.exprs.size(); ++i)
          if (truthy(eval(*n.exprs[i]))) return exec(n.bodies[i]);
        return n.bodies.size() > n.exprs.size() ? exec(n.bodies.back()) : Flow::Normal;
      case Node::Kind::For:
        exec_for(n);
        return Flow::Normal;
      case Node::Kind::Set:
        assign(n, eval(*n.exprs[0]));
        return Flow::Normal;
      case Node::Kind::SetBlock: {
        Value v = Value::string(capture(n.bodies[0]));
        assign(n, n.exprs.empty() ? v : filter_chain(*n.exprs[0], v));
        return Flow::Normal;
      }
      case Node::Kind::FilterBlock:
        append_str(*out_, filter_chain(*n.exprs[0], Value::string(capture(n.bodies[0]))), guard_);
        return Flow::Normal;
      case Node::Kind::Macro:
        define_macro(n);
        return Flow::Normal;
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
      case Node::Kind::Generation:
        return exec(n.bodies[0]);
    }
    return Flow::Normal;
  }

  std::string capture(const Body& body) {
    std::string buf;
    within(child_scope(), &buf, [&] { return exec(body); });
    return buf;
  }

  // Binds names to v in scope s: one name takes v, several unpack a sequence of as many.
  void bind(Scope& s, const std::vector<std::string>& names, const Value& v) {
    if (names.size() == 1) {
      s.set(names[0], v);
      return;
    }
    const std::vector<Value> items = iterate(v, guard_);
    if (items.size() != names.size())
      fail(items.size() > names.size() ? "too many values to unpack (expected " + std::to_string(names.size()) + ")"
                                       : "not enough values to unpack (expected " + std::to_string(names.size()) +
                                             ", got " + std::to_string(items.size()) + ")");
    for (size_t i = 0; i < names.size(); ++i) s.set(names[i], items[i]);
  }

  void assign(const Node& n, const Value& v) {
    if (!n.namespace_attr) {
      bind(*scope_, n.targets, v);
      return;
    }
    const Value ns = lookup(n.targets[0]);
    if (ns.kind() != Value::Kind::Namespace)
      fail("cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
    if (n.targets[1][0] == '_')
      fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + n.targets[1] + "'");
    DictData& d = ns.namespace_data();
    for (auto& [k, old] : d.items)
      if (k.is_string() && k.str() == n.targets[1]) {
        old = v;
        return;
      }
    guard_.check_items(d.items.size() + 1);
    d.depth = std::max(d.depth, v.depth() + 1);
    guard_.check_depth(d.depth);
    d.items.emplace_back(Value::string(n.targets[1]), v);
  }

  Value loop_object(const std::vector<Value>& items, size_t i) {
    const auto n = static_cast<int64_t>(items.size()), k = static_cast<int64_t>(i);
    std::vector<std::pair<Value, Value>> f = {
        {Value::string("index"), Value::integer(k + 1)},    {Value::string("index0"), Value::integer(k)},
        {Value::string("revindex"), Value::integer(n - k)}, {Value::string("revindex0"), Value::integer(n - k - 1)},
        {Value::string("first"), Value::boolean(k == 0)},   {Value::string("last"), Value::boolean(k == n - 1)},
        {Value::string("length"), Value::integer(n)},       {Value::string("depth"), Value::integer(1)},
        {Value::string("depth0"), Value::integer(0)}};
    if (i > 0) f.emplace_back(Value::string("previtem"), items[i - 1]);
    if (i + 1 < items.size()) f.emplace_back(Value::string("nextitem"), items[i + 1]);
    f.emplace_back(Value::string("cycle"), Value::function("loop.cycle", [i](CallArgs& a) {
                     if (a.args.empty()) fail("no items for cycling given");
                     return a.args[i % a.args.size()];
                   }));
    return Value::dict(std::move(f), guard_);
  }

  void exec_for(const Node& n) {
    std::vector<Value> items = iterate(eval(*n.exprs[0]), guard_);
    if (n.exprs.size() > 1) {
      std::vector<Value> kept;
      for (Value& x : items) {
        auto s = child_scope();
        bind(*s, n.targets, x);
        if (truthy(within(s, nullptr, [&] { return eval(*n.exprs[1]); }))) kept.push_back(std::move(x));
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      guard_.step();
      auto s = child_scope();
      bind(*s, n.targets, items[i]);
      s->set("loop", loop_object(items, i));
      if (within(s, nullptr, [&] { return exec(n.bodies[0]); }) == Flow::Break) break;
    }
    if (items.empty()) within(child_scope(), nullptr, [&] { return exec(n.bodies[1]); });
  }

  void define_macro(const Node& n) {
    std::weak_ptr<Scope> defined_in = scope_;
    const Node* node = &n;
    scope_->set(n.targets[0], Value::function(n.targets[0], [this, node, defined_in](CallArgs& a) {
                  return call_macro(*node, defined_in, a);
                }));
  }

  Value call_macro(const Node& m, const std::weak_ptr<Scope>& defined_in, CallArgs& a) {
    auto parent = defined_in.lock();
    if (!parent) fail("the macro '" + m.targets[0] + "' was called after the block that defined it ended");
    const size_t nparams = m.targets.size() - 1;
    if (a.args.size() > nparams)
      fail("macro '" + m.targets[0] + "' takes not more than " + std::to_string(nparams) + " argument(s)");
    auto s = std::make_shared<Scope>();
    s->parent = parent;
    std::vector<bool> given(nparams, false);
    for (size_t i = 0; i < a.args.size(); ++i) s->set(m.targets[i + 1], a.args[i]), given[i] = true;
    for (const auto& [key, v] : a.kwargs) {
      const auto it = std::find(m.targets.begin() + 1, m.targets.end(), key);
      if (it == m.targets.end()) fail("macro '" + m.targets[0] + "' takes no keyword argument '" + key + "'");
      const size_t i = static_cast<size_t>(it - m.targets.begin()) - 1;
      if (given[i]) fail("macro '" + m.targets[0] + "' got multiple values for argument '" + key + "'");
      s->set(key, v), given[i] = true;
    }
    struct Depth {
      int& calls;
      ~Depth() { --calls; }
    } depth{++calls_};
    guard_.check_depth(calls_);
    std::string buf;
    within(s, &buf, [&] {
      for (size_t i = 0; i < nparams; ++i)
        if (!given[i])
          scope_->set(m.targets[i + 1],
                      m.exprs[i] ? eval(*m.exprs[i])
                                 : Value::undefined("the macro parameter '" + m.targets[i + 1] + "' was not given"));
      return exec(m.bodies[0]);
    });
    return Value::string(std::move(buf));
  }

  Value lookup(const std::string& name) const {
    if (const Value* v = scope_->find(name)) return *v;
    for (const auto& [k, v] : globals_)
      if (k == name) return v;
    return Value::undefined("'" + name + "' is undefined");
  }

  Value eval(const Expr& e) {
    try {
      guard_.step();
      return eval_inner(e);
    } catch (const Failure& f) {
      throw PositionedFailure{e.pos, f.message};
    }
  }

  Value eval_opt(const ExprPtr& e) { return e ? eval(*e) : Value::none(); }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Const:
        return e.value;
      case Expr::Kind::Name:
        return lookup(e.name);
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        std::vector<Value> items;
        for (const ExprPtr& x : e.args) items.push_back(eval(*x));
        return e.kind == Expr::Kind::List ? Value::list(std::move(items), guard_)
                                          : Value::tuple(std::move(items), guard_);
      }
      case Expr::Kind::Dict: {
        std::vector<std::pair<Value, Value>> items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) items.emplace_back(eval(*e.args[i]), eval(*e.args[i + 1]));
        return Value::dict(std::move(items), guard_);
      }
      case Expr::Kind::Attr:
        return get_attr(eval(*e.args[0]), e.name, guard_);
      case Expr::Kind::Item:
        return get_item(eval(*e.args[0]), eval(*e.args[1]), guard_);
      case Expr::Kind::Slice:
        return get_slice(eval(*e.args[0]), eval_opt(e.args[1]), eval_opt(e.args[2]), eval_opt(e.args[3]), guard_);
      case Expr::Kind::Call:
        return call(e);
      case Expr::Kind::Filter:
        return apply_filter_expr(e, eval(*e.args[0]));
      case Expr::Kind::Test: {
        const Value subject = eval(*e.args[0]);
        CallArgs a = arguments(e, 1);
        return Value::boolean(apply_test(e.name, subject, a) != e.negated);
      }
      default:
        return eval_operator(e);
    }
  }

  Value eval_operator(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0]);
        return e.name == "not" ? Value::boolean(!truthy(v)) : unary_op(e.name[0], v);
      }
      case Expr::Kind::Binary: {
        const Value a = eval(*e.args[0]);
        return binary_op(e.name, a, eval(*e.args[1]), guard_);
      }
      case Expr::Kind::And: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::Concat: {
        std::string out;
        for (const ExprPtr& x : e.args) append_str(out, eval(*x), guard_);
        return Value::string(std::move(out));
      }
      case Expr::Kind::Compare:
        return Value::boolean(compare(e));
      case Expr::Kind::Cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2])
                         : Value::undefined("the condition of an inline if was false and it has no else");
      default:
        fail("internal: unknown expression");
    }
  }

  bool compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1]);
      const std::string& op = e.ops[i];
      bool ok;
      if (op == "==")
        ok = equal(left, right, guard_);
      else if (op == "!=")
        ok = !equal(left, right, guard_);
      else if (op == "<")
        ok = less(left, right, guard_);
      else if (op == ">")
        ok = less(right, left, guard_);
      else if (op == "<=")
        ok = less(left, right, guard_) || equal(left, right, guard_);
      else if (op == ">=")
        ok = less(right, left, guard_) || equal(left, right, guard_);
      else if (op == "in")
        ok = contains(right, left, guard_);
      else
        ok = !contains(right, left, guard_);
      if (!ok) return false;
      left = std::move(right);
    }
    return true;
  }

  // The arguments of a call, filter or test: e.args from index first, and e.kwargs.
  CallArgs arguments(const Expr& e, size_t first) {
    CallArgs a{{}, {}, guard_};
    for (size_t i = first; i < e.args.size(); ++i) a.args.push_back(eval(*e.args[i]));
    for (const auto& [k, x] : e.kwargs) a.kwargs.emplace_back(k, eval(*x));
    return a;
  }

  Value call(const Expr& e) {
    const Value f = eval(*e.args[0]);
    if (f.is_undefined()) fail(f.str().empty() ? std::string("an undefined value was called") : f.str());
    if (f.kind() != Value::Kind::Function) fail("'" + type_name(f) + "' object is not callable");
    CallArgs a = arguments(e, 1);
    return f.fn().fn(a);
  }

  Value apply_filter_expr(const Expr& f, const Value& input) {
    CallArgs a = arguments(f, 1);
    return apply_filter(f.name, input, a);
  }

  // A filter chain whose innermost input is the block's output (args[0] null at the bottom).
  Value filter_chain(const Expr& f, const Value& input) {
    try {
      return apply_filter_expr(f, f.args[0] ? filter_chain(*f.args[0], input) : input);
    } catch (const Failure& x) {
      throw PositionedFailure{f.pos, x.message};
    }
  }
};

}  // namespace render_impl

Template Template::parse(const std::string& source, std::string name, Limits limits) {
  if (source.size() > limits.max_source_bytes)
    throw Error(name + ": the template has " + std::to_string(source.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_source_bytes));
  auto program = std::make_shared<Program>();
  program->name = std::move(name);
  program->source = normalize_newlines(source);
  program->limits = limits;
  try {
    program->body = jinja::parse(tokenize(program->source), limits);
  } catch (const SyntaxFailure& f) {
    throw Error(render_impl::where(program->name, program->source, f.pos) + f.message);
  }
  Template t;
  t.program_ = std::move(program);
  return t;
}

std::string Template::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  const Program& p = *program_;
  if (!variables.is_object() && !variables.is_null())
    throw Error(p.name + ": the variables must be a JSON object (or null)");
  Guard guard(p.limits);
  try {
    auto root = std::make_shared<render_impl::Scope>();
    for (auto it = variables.begin(); it != variables.end(); ++it) root->set(it.key(), from_json(it.value(), guard));
    return render_impl::Renderer(p.body, guard, std::move(root), global_functions(options.now)).run();
  } catch (const render_impl::PositionedFailure& f) {
    throw Error(render_impl::where(p.name, p.source, f.pos) + f.message);
  } catch (const Failure& f) {
    throw Error(p.name + ": " + f.message);
  }
}

const std::string& Template::name() const { return program_->name; }
const std::string& Template::source() const { return program_->source; }

}  // namespace wm::llm::jinja
