#include "llmkv/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "llmkv/jinja_text.h"

namespace wm::llm::jinja {

void fail(std::string message) { throw Failure{std::move(message)}; }

void Guard::step(uint64_t n) {
  if (n > steps_left_)
    fail("the template ran past its limit of " + std::to_string(limits_.max_steps) + " evaluation steps");
  steps_left_ -= n;
}

void Guard::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    fail("a string of " + std::to_string(bytes) + " bytes would pass the limit of " +
         std::to_string(limits_.max_output_bytes) + " bytes");
}

void Guard::check_items(size_t n) const {
  if (n > limits_.max_items)
    fail("a list or dict of " + std::to_string(n) + " elements would pass the limit of " +
         std::to_string(limits_.max_items));
}

void Guard::check_depth(int depth) const {
  if (depth > limits_.max_depth)
    fail("nesting " + std::to_string(depth) + " deep passes the limit of " + std::to_string(limits_.max_depth));
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(key.str());
  for (const auto& [k, v] : items) {
    if (k.is_number() && key.is_number() && k.as_float() == key.as_float() &&
        (k.kind() == Value::Kind::Float || key.kind() == Value::Kind::Float || k.as_int() == key.as_int()))
      return &v;
    if (k.is_none() && key.is_none()) return &v;
  }
  return nullptr;
}

const Value* DictData::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}

Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::Float;
  v.f_ = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.s_ = std::move(s);
  return v;
}

int Value::depth() const {
  if (list_) return list_->depth;
  if (dict_) return dict_->depth;
  return 0;
}

Value Value::list(std::vector<Value> items, const Guard& guard) {
  guard.check_items(items.size());
  auto data = std::make_shared<ListData>();
  for (const Value& x : items) data->depth = std::max(data->depth, x.depth() + 1);
  guard.check_depth(data->depth);
  data->items = std::move(items);
  Value v;
  v.kind_ = Kind::List;
  v.list_ = std::move(data);
  return v;
}

Value Value::tuple(std::vector<Value> items, const Guard& guard) {
  Value v = list(std::move(items), guard);
  v.kind_ = Kind::Tuple;
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> items, const Guard& guard) {
  guard.check_items(items.size());
  auto data = std::make_shared<DictData>();
  data->items.reserve(items.size());
  for (auto& [k, x] : items) {
    data->depth = std::max(data->depth, std::max(k.depth(), x.depth()) + 1);
    if (const Value* old = data->find(k))
      *const_cast<Value*>(old) = std::move(x);  // Python keeps the first key's place, the last value
    else
      data->items.emplace_back(std::move(k), std::move(x));
  }
  guard.check_depth(data->depth);
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::move(data);
  return v;
}

Value Value::make_namespace(std::vector<std::pair<Value, Value>> items, const Guard& guard) {
  Value v = dict(std::move(items), guard);
  v.kind_ = Kind::Namespace;
  return v;
}

Value Value::function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<const FunctionData>(FunctionData{std::move(name), std::move(fn)});
  return v;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "NoneType";
    case Value::Kind::Bool:
      return "bool";
    case Value::Kind::Int:
      return "int";
    case Value::Kind::Float:
      return "float";
    case Value::Kind::String:
      return "str";
    case Value::Kind::List:
      return "list";
    case Value::Kind::Tuple:
      return "tuple";
    case Value::Kind::Dict:
      return "dict";
    case Value::Kind::Namespace:
      return "Namespace";
    case Value::Kind::Function:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
      return v.as_bool();
    case Value::Kind::Int:
      return v.as_int() != 0;
    case Value::Kind::Float:
      return v.as_float() != 0;
    case Value::Kind::String:
      return !v.str().empty();
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return !v.items().empty();
    case Value::Kind::Dict:
      return !v.dict().items.empty();
    case Value::Kind::Namespace:
    case Value::Kind::Function:
      return true;
  }
  return false;
}

// Python's repr of a float: the shortest digits that read back the same, fixed notation for
// exponents -4 < e <= 16 of 0.d1d2..., scientific otherwise with a two-digit exponent at least.
std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-1.2345e+17", "0e+00"
  std::string out;
  if (sci[0] == '-') {
    out = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int decpt = std::stoi(sci.substr(e + 1)) + 1;
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= n) return out + digits + std::string(decpt - n, '0') + ".0";
    return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  out += digits[0];
  if (n > 1) out += "." + digits.substr(1);
  const int x = decpt - 1;
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", x < 0 ? '-' : '+', std::abs(x));
  return out + exp;
}

namespace value_impl {

// Code points that Python's str.isprintable() refuses, as far as this list knows them (controls,
// separators, format characters, private use); repr() escapes them.
bool unprintable(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || (c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD ||
         c == 0x70F || c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
         (c >= 0x205F && c <= 0x206F) || c == 0x3000 || (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF ||
         (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF || (c >= 0xE0000 && c <= 0xE0FFF) || c >= 0xF0000;
}

void append_hex_escape(std::string& out, uint32_t c) {
  char buf[16];
  if (c < 0x100)
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
  else if (c < 0x10000)
    std::snprintf(buf, sizeof buf, "\\u%04x", c);
  else
    std::snprintf(buf, sizeof buf, "\\U%08x", c);
  out += buf;
}

void append_string_repr(std::string& out, const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  out += q;
  for (size_t i = 0; i < s.size();) {
    const text::CodePoint c = text::decode_at(s, i);
    if (c.cp == static_cast<uint32_t>(q) || c.cp == '\\') {
      out += '\\';
      out += static_cast<char>(c.cp);
    } else if (c.cp == '\n') {
      out += "\\n";
    } else if (c.cp == '\r') {
      out += "\\r";
    } else if (c.cp == '\t') {
      out += "\\t";
    } else if (unprintable(c.cp) || (c.len == 1 && c.cp >= 0x80)) {
      append_hex_escape(out, c.cp);
    } else {
      out.append(s, i, c.len);
    }
    i += c.len;
  }
  out += q;
}

void append_items_repr(std::string& out, const Value& v, Guard& guard) {
  const bool tuple = v.kind() == Value::Kind::Tuple;
  out += tuple ? '(' : '[';
  bool first = true;
  for (const Value& x : v.items()) {
    if (!first) out += ", ";
    first = false;
    append_repr(out, x, guard);
  }
  if (tuple && v.items().size() == 1) out += ',';
  out += tuple ? ')' : ']';
}

void append_dict_repr(std::string& out, const DictData& d, Guard& guard) {
  out += '{';
  bool first = true;
  for (const auto& [k, x] : d.items) {
    if (!first) out += ", ";
    first = false;
    append_repr(out, k, guard);
    out += ": ";
    append_repr(out, x, guard);
  }
  out += '}';
}

}  // namespace value_impl

void append_repr(std::string& out, const Value& v, Guard& guard) {
  guard.step();
  guard.check_size(out.size());
  switch (v.kind()) {
    case Value::Kind::Undefined:
      out += "Undefined";
      return;
    case Value::Kind::String:
      value_impl::append_string_repr(out, v.str());
      return;
    default:
      append_str(out, v, guard);
  }
}

void append_str(std::string& out, const Value& v, Guard& guard) {
  guard.step();
  switch (v.kind()) {
    case Value::Kind::Undefined:
      break;
    case Value::Kind::None:
      out += "None";
      break;
    case Value::Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      break;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      break;
    case Value::Kind::Float:
      out += float_repr(v.as_float());
      break;
    case Value::Kind::String:
      guard.step_bytes(v.str().size());
      out += v.str();
      break;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      value_impl::append_items_repr(out, v, guard);
      break;
    case Value::Kind::Dict:
      value_impl::append_dict_repr(out, v.dict(), guard);
      break;
    case Value::Kind::Namespace:
      out += "<Namespace ";
      value_impl::append_dict_repr(out, v.dict(), guard);
      out += '>';
      break;
    case Value::Kind::Function:
      fail("cannot turn the function '" + v.fn().name + "' into text");
  }
  guard.check_size(out.size());
}

std::string to_str(const Value& v, Guard& guard) {
  if (v.is_string()) {
    guard.step_bytes(v.str().size());
    return v.str();
  }
  std::string out;
  append_str(out, v, guard);
  return out;
}

bool equal(const Value& a, const Value& b, Guard& guard) {
  guard.step();
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::Float || b.kind() == K::Float) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
      guard.step_bytes(std::min(a.str().size(), b.str().size()));
      return a.str() == b.str();
    case K::List:
    case K::Tuple: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equal(a.items()[i], b.items()[i], guard)) return false;
      return true;
    }
    case K::Dict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, x] : a.dict().items) {
        const Value* y = b.dict().find(k);
        if (y == nullptr || !equal(x, *y, guard)) return false;
      }
      return true;
    }
    case K::Namespace:
      return &a.dict() == &b.dict();
    case K::Function:
      return &a.fn() == &b.fn();
    default:
      return false;
  }
}

namespace value_impl {
[[noreturn]] void undefined_used(const Value& v) {
  fail(v.str().empty() ? std::string("an undefined value was used") : v.str());
}
}  // namespace value_impl

bool less(const Value& a, const Value& b, Guard& guard) {
  guard.step();
  if (a.is_undefined()) value_impl::undefined_used(a);
  if (b.is_undefined()) value_impl::undefined_used(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like()) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_string() && b.is_string()) {
    guard.step_bytes(std::min(a.str().size(), b.str().size()));
    return a.str() < b.str();  // UTF-8 keeps code point order
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i], guard)) return less(x[i], y[i], guard);
    return x.size() < y.size();
  }
  fail("'<' is not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

namespace value_impl {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value int_result(bool overflow, int64_t r) {
  if (overflow) fail("integer overflow (this interpreter's ints are 64-bit)");
  return Value::integer(r);
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) fail("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  int64_t r = 1;
  bool over = false;
  while (exp > 0 && !over) {
    if (exp & 1) over = __builtin_mul_overflow(r, base, &r);
    exp >>= 1;
    if (exp > 0 && !over) over = __builtin_mul_overflow(base, base, &base);
  }
  return int_result(over, r);
}

Value int_arith(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  bool over = false;
  if (op == "+" || op == "-" || op == "*") {
    over = op == "+"   ? __builtin_add_overflow(x, y, &r)
           : op == "-" ? __builtin_sub_overflow(x, y, &r)
                       : __builtin_mul_overflow(x, y, &r);
    return int_result(over, r);
  }
  if (op == "**") return int_pow(x, y);
  if (y == 0) fail(op == "/" ? "division by zero" : "integer division or modulo by zero");
  if (op == "/") return Value::number(static_cast<double>(x) / static_cast<double>(y));
  if (x == std::numeric_limits<int64_t>::min() && y == -1) return int_result(true, 0);
  int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    q -= 1;
    m += y;
  }
  return Value::integer(op == "//" ? q : m);
}

// CPython's float_divmod and float_pow.
Value float_arith(const std::string& op, double x, double y) {
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "**") {
    if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
    if (x < 0 && std::isfinite(y) && y != std::floor(y)) fail("a negative number to a fractional power is complex");
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) fail("numerical result out of range");
    return Value::number(r);
  }
  if (y == 0) fail(op == "/" ? "float division by zero" : "float divmod()");
  if (op == "/") return Value::number(x / y);
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  if (op == "%") return Value::number(mod);
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  return Value::number(floordiv);
}

Value repeat(const Value& seq, int64_t n, Guard& guard) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (n > 0 && seq.str().size() > 0)
      guard.check_size(seq.str().size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)));
    std::string out;
    for (int64_t i = 0; i < n && !seq.str().empty(); ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  if (n > 0 && !seq.items().empty())
    guard.check_items(seq.items().size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)));
  std::vector<Value> out;
  for (int64_t i = 0; i < n && !seq.items().empty(); ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  guard.step(out.size());
  return seq.kind() == Value::Kind::Tuple ? Value::tuple(std::move(out), guard) : Value::list(std::move(out), guard);
}

// Python's printf-style str % value: %s, %r, %d / %i, %%, and %(key)s with a dict; flags,
// widths and precisions are refused.
Value percent_format(const std::string& fmt, const Value& arg, Guard& guard) {
  const std::vector<Value> args = arg.kind() == Value::Kind::Tuple ? arg.items() : std::vector<Value>{arg};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* v = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos || !arg.is_mapping()) fail("format requires a mapping");
      v = arg.dict().find(fmt.substr(i + 1, close - i - 1));
      if (v == nullptr) fail("format key '" + fmt.substr(i + 1, close - i - 1) + "' not found");
      i = close + 1;
      if (i >= fmt.size()) fail("incomplete format");
    } else {
      if (next >= args.size()) fail("not enough arguments for format string");
      v = &args[next++];
    }
    const char c = fmt[i];
    if (c == 's') {
      append_str(out, *v, guard);
    } else if (c == 'r') {
      append_repr(out, *v, guard);
    } else if (c == 'd' || c == 'i') {
      if (!v->is_number()) fail("%" + std::string(1, c) + " format: a real number is required, not " + type_name(*v));
      out += std::to_string(v->is_int_like() ? v->as_int() : static_cast<int64_t>(std::trunc(v->as_float())));
    } else {
      fail(std::string("the format '%") + c + "' is not supported here (only %s, %r, %d, %i, %%)");
    }
    guard.check_size(out.size());
  }
  if (!arg.is_mapping() && next < args.size()) fail("not all arguments converted during string formatting");
  return Value::string(std::move(out));
}

}  // namespace value_impl

Value binary_op(const std::string& op, const Value& a, const Value& b, Guard& guard) {
  if (a.is_undefined()) value_impl::undefined_used(a);
  if (b.is_undefined()) value_impl::undefined_used(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like()) return value_impl::int_arith(op, a.as_int(), b.as_int());
    return value_impl::float_arith(op, a.as_float(), b.as_float());
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    guard.check_size(a.str().size() + b.str().size());
    guard.step_bytes(a.str().size() + b.str().size());
    return Value::string(a.str() + b.str());
  }
  if (op == "+" && a.is_sequence() && a.kind() == b.kind()) {
    std::vector<Value> out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    guard.step(out.size());
    return a.kind() == Value::Kind::Tuple ? Value::tuple(std::move(out), guard) : Value::list(std::move(out), guard);
  }
  if (op == "*" && (a.is_string() || a.is_sequence()) && b.is_int_like())
    return value_impl::repeat(a, b.as_int(), guard);
  if (op == "*" && (b.is_string() || b.is_sequence()) && a.is_int_like())
    return value_impl::repeat(b, a.as_int(), guard);
  if (op == "%" && a.is_string()) return value_impl::percent_format(a.str(), b, guard);
  value_impl::unsupported(op, a, b);
}

Value unary_op(char op, const Value& a) {
  if (a.is_undefined()) value_impl::undefined_used(a);
  if (a.kind() == Value::Kind::Float) return Value::number(op == '-' ? -a.as_float() : a.as_float());
  if (a.is_int_like()) {
    if (op == '+') return Value::integer(a.as_int());
    if (a.as_int() == std::numeric_limits<int64_t>::min())
      fail("integer overflow (this interpreter's ints are 64-bit)");
    return Value::integer(-a.as_int());
  }
  fail(std::string("bad operand type for unary ") + op + ": '" + type_name(a) + "'");
}

bool contains(const Value& container, const Value& item, Guard& guard) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
      guard.step_bytes(container.str().size());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      for (const Value& x : container.items())
        if (equal(x, item, guard)) return true;
      return false;
    case Value::Kind::Dict:
      guard.step(container.dict().items.size());
      return container.dict().find(item) != nullptr;
    default:
      fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

std::vector<Value> iterate(const Value& v, Guard& guard) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return v.items();
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (size_t i = 0; i < v.str().size();) {
        const size_t n = text::decode_at(v.str(), i).len;
        chars.push_back(Value::string(v.str().substr(i, n)));
        i += n;
      }
      guard.step(chars.size());
      return chars;
    }
    default:
      fail("'" + type_name(v) + "' object is not iterable");
  }
}

size_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return text::code_point_count(v.str());
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return v.items().size();
    case Value::Kind::Dict:
      return v.dict().items.size();
    default:
      fail("object of type '" + type_name(v) + "' has no len()");
  }
}

namespace value_impl {

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const text::CodePoint c = text::decode_at(s, i);
    switch (c.cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c.cp < 0x20 || (ensure_ascii && c.cp >= 0x7F)) {
          if (c.cp >= 0x10000) {
            const uint32_t v = c.cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", c.cp);
          }
          out += buf;
        } else {
          out.append(s, i, c.len);
        }
    }
    i += c.len;
  }
  out += '"';
}

// json.dumps's float: repr, with NaN / Infinity / -Infinity.
std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return float_repr(f);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::String:
      return k.str();
    case Value::Kind::Int:
      return std::to_string(k.as_int());
    case Value::Kind::Float:
      return json_float(k.as_float());
    case Value::Kind::Bool:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::None:
      return "null";
    default:
      fail("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void newline_indent(std::string& out, const JsonStyle& style, int level) {
  out += '\n';
  for (int i = 0; i < level; ++i) out += style.indent;
}

void append_json_dict(std::string& out, const DictData& d, const JsonStyle& style, Guard& guard, int level) {
  if (d.items.empty()) {
    out += "{}";
    return;
  }
  std::vector<const std::pair<Value, Value>*> items;
  for (const auto& kv : d.items) items.push_back(&kv);
  if (style.sort_keys)
    std::stable_sort(items.begin(), items.end(), [&](auto* x, auto* y) { return less(x->first, y->first, guard); });
  out += '{';
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += style.item_sep;
    if (style.indent_set) newline_indent(out, style, level + 1);
    append_json_string(out, json_key(items[i]->first), style.ensure_ascii);
    out += style.key_sep;
    append_json(out, items[i]->second, style, guard, level + 1);
  }
  if (style.indent_set) newline_indent(out, style, level);
  out += '}';
}

}  // namespace value_impl

void append_json(std::string& out, const Value& v, const JsonStyle& style, Guard& guard, int level) {
  guard.step();
  guard.check_size(out.size());
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float:
      out += value_impl::json_float(v.as_float());
      return;
    case Value::Kind::String:
      guard.step_bytes(v.str().size());
      value_impl::append_json_string(out, v.str(), style.ensure_ascii);
      return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += style.item_sep;
        if (style.indent_set) value_impl::newline_indent(out, style, level + 1);
        append_json(out, v.items()[i], style, guard, level + 1);
      }
      if (style.indent_set) value_impl::newline_indent(out, style, level);
      out += ']';
      return;
    }
    case Value::Kind::Dict:
      value_impl::append_json_dict(out, v.dict(), style, guard, level);
      return;
    default:
      fail("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

namespace value_impl {

template <class Json>
Value json_to_value(const Json& j, const Guard& guard, int depth) {
  guard.check_depth(depth);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("integer " + std::to_string(u) + " is past 64 bits");
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      for (const auto& x : j) items.push_back(json_to_value(x, guard, depth + 1));
      return Value::list(std::move(items), guard);
    }
    case nlohmann::json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      for (auto it = j.begin(); it != j.end(); ++it)
        items.emplace_back(Value::string(it.key()), json_to_value(it.value(), guard, depth + 1));
      return Value::dict(std::move(items), guard);
    }
    default:
      fail("JSON value of an unsupported type (binary)");
  }
}

}  // namespace value_impl

Value from_json(const nlohmann::ordered_json& j, const Guard& guard) { return value_impl::json_to_value(j, guard, 0); }
Value from_json(const nlohmann::json& j, const Guard& guard) { return value_impl::json_to_value(j, guard, 0); }

}  // namespace wm::llm::jinja
