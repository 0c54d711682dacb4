#pragma once
// The values a chat template computes with (llmkv/jinja.h): Python's None, bool, int, float, str,
// list, tuple and dict, Jinja's undefined and namespace, and callables (built-in functions, bound
// methods, macros). Lists, tuples and dicts do not change once built (transformers renders in
// Jinja's immutable sandbox); a namespace is shared and changes through `set ns.attr = ...`.
// The operations follow Python 3: str() of a float is its shortest repr, 1 == 1.0 == True, int / int
// is a float, % takes the divisor's sign, ints are 64-bit here (an overflow is an error, where
// Python would grow). They fail with jinja::Failure, which the interpreter turns into a wm::Error
// naming the template's line and column.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace wm::llm::jinja {

// The bounds of one template; parsing and rendering stop with wm::Error when one is passed.
struct Limits {
  size_t max_source_bytes = size_t{1} << 20;  // the template's text
  size_t max_output_bytes = size_t{8} << 20;  // the rendered text, and any one string built on the way
  size_t max_items = size_t{1} << 20;         // the elements of any one list or dict built while rendering
  uint64_t max_steps = 20'000'000;  // evaluations, loop iterations, elements visited by a comparison, print or JSON
  int max_depth = 64;  // nesting: blocks and expressions when parsing; macro calls and lists / dicts when rendering
};

// A failed operation, without a position: the interpreter adds the template's line and column.
struct Failure {
  std::string message;
};
[[noreturn]] void fail(std::string message);

// The counters of one render, checked against its Limits; each check throws Failure.
class Guard {
 public:
  explicit Guard(const Limits& limits) : limits_(limits), steps_left_(limits.max_steps) {}
  void step(uint64_t n = 1);
  // Work over n bytes of text (one step per 64 bytes): bounds loops over long strings.
  void step_bytes(size_t n) { step(1 + n / 64); }
  void check_size(size_t bytes) const;  // a string of this many bytes
  void check_items(size_t n) const;     // a list or dict of n elements
  void check_depth(int depth) const;    // nested lists / dicts, macro calls
  const Limits& limits() const { return limits_; }

 private:
  Limits limits_;
  uint64_t steps_left_;
};

class Value;
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  Guard& guard;
};
using NativeFn = std::function<Value(CallArgs&)>;

struct ListData {
  std::vector<Value> items;
  int depth = 1;  // 1 + the deepest element's depth (scalars count 0)
};
struct DictData {
  std::vector<std::pair<Value, Value>> items;  // in insertion order, as Python keeps them
  int depth = 1;
  const Value* find(const Value& key) const;  // by Python equality (1 and 1.0 and True are one key)
  const Value* find(const std::string& key) const;
};
struct FunctionData {
  std::string name;
  NativeFn fn;
};

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Function };

  Value() = default;  // undefined, with no hint
  // Undefined, remembering why (for the error when it is used): "'x' is undefined".
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  // Containers check their element count and depth against the guard's limits (Failure).
  static Value list(std::vector<Value> items, const Guard& guard);
  static Value tuple(std::vector<Value> items, const Guard& guard);
  static Value dict(std::vector<std::pair<Value, Value>> items,
                    const Guard& guard);  // later duplicates replace earlier
  static Value make_namespace(std::vector<std::pair<Value, Value>> items, const Guard& guard);
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_int_like() const { return kind_ == Kind::Int || kind_ == Kind::Bool; }  // Python's bool is an int
  bool is_number() const { return is_int_like() || kind_ == Kind::Float; }
  bool is_sequence() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_mapping() const { return kind_ == Kind::Dict; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? int64_t{b_} : i_; }  // Int or Bool
  double as_float() const { return kind_ == Kind::Float ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return s_; }                     // String; Undefined's hint
  const std::vector<Value>& items() const { return list_->items; }  // List or Tuple
  const DictData& dict() const { return *dict_; }                   // Dict or Namespace
  DictData& namespace_data() const { return *dict_; }               // Namespace: changes through set
  const FunctionData& fn() const { return *fn_; }
  int depth() const;  // 0 for scalars

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<const ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<const FunctionData> fn_;
};

// Python's type name ("str", "int", "list", "dict", "NoneType", "undefined", ...).
std::string type_name(const Value& v);
// Python's bool(v) (an undefined value is false).
bool truthy(const Value& v);
// str(v) appended to out ("" for undefined, "None", "True", 1.0, "[1, 'a']", ...). Failure for a function.
void append_str(std::string& out, const Value& v, Guard& guard);
std::string to_str(const Value& v, Guard& guard);
// repr(v) appended to out ('a', "it's", ...).
void append_repr(std::string& out, const Value& v, Guard& guard);
// Python's repr of a float (shortest round trip: 0.1, 1e-05, 1e+16, 5.0, inf, nan).
std::string float_repr(double f);

// Python's ==.
bool equal(const Value& a, const Value& b, Guard& guard);
// Python's <: numbers, strings (by code point), lists / tuples element by element; Failure otherwise.
bool less(const Value& a, const Value& b, Guard& guard);
// Python's binary operators "+", "-", "*", "/", "//", "%", "**" and unary "-" / "+". Failure on a
// type Python refuses, division by zero, an int overflow or a result past the limits.
Value binary_op(const std::string& op, const Value& a, const Value& b, Guard& guard);
Value unary_op(char op, const Value& a);
// Python's `a in b`.
bool contains(const Value& container, const Value& item, Guard& guard);

// The elements `for x in v` visits: a list's or tuple's items, a dict's keys, a string's code
// points; nothing for undefined. Failure for what Python cannot iterate.
std::vector<Value> iterate(const Value& v, Guard& guard);
// len(v); Failure for what has none.
size_t length(const Value& v);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it.
struct JsonStyle {
  bool ensure_ascii = false;
  bool indent_set = false;  // indent=None unless set
  std::string indent;       // the indent string (an int n gives n spaces)
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
void append_json(std::string& out, const Value& v, const JsonStyle& style, Guard& guard, int level = 0);

// Values from JSON (objects keep their order with ordered_json; nlohmann::json sorts keys).
// Failure past the guard's depth or size limits.
Value from_json(const nlohmann::ordered_json& j, const Guard& guard);
Value from_json(const nlohmann::json& j, const Guard& guard);

}  // namespace wm::llm::jinja
