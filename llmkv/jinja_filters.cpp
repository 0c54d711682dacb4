// Jinja's filters and tests, and the global functions transformers gives a chat template
// (llmkv/jinja_builtins.h), with Python's and Jinja's semantics.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "llmkv/jinja_builtins.h"
#include "llmkv/jinja_text.h"

namespace wm::llm::jinja {
namespace filters_impl {

using FilterFn = Value (*)(const Value&, CallArgs&);
using TestFn = bool (*)(const Value&, CallArgs&);

// The digits of s[i..] in base (single underscores between digits allowed): their end, or npos.
size_t digit_run(const std::string& s, size_t i, int base) {
  auto digit = [&](size_t k) {
    if (k >= s.size()) return false;
    const char c = static_cast<char>(s[k] | 0x20);
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    return d < base;
  };
  if (!digit(i)) return std::string::npos;
  while (digit(i) || (s[i] == '_' && digit(i + 1))) ++i;
  return i;
}

std::string without_underscores(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '_') out += c;
  return out;
}

// Python's float(str): whitespace around, a sign, digits with underscores, inf / nan.
std::optional<double> parse_float(const std::string& text) {
  const std::string s = text::strip(text, nullptr, true, true);
  size_t i = s[0] == '+' || s[0] == '-' ? 1 : 0;
  std::string low = text::lower(s.substr(i));
  const double sign = !s.empty() && s[0] == '-' ? -1.0 : 1.0;
  if (low == "inf" || low == "infinity") return sign * std::numeric_limits<double>::infinity();
  if (low == "nan") return std::numeric_limits<double>::quiet_NaN();
  size_t end = i;
  const size_t intpart = digit_run(s, i, 10);
  if (intpart != std::string::npos) end = intpart;
  bool digits = intpart != std::string::npos;
  if (end < s.size() && s[end] == '.') {
    const size_t frac = digit_run(s, end + 1, 10);
    digits = digits || frac != std::string::npos;
    end = frac != std::string::npos ? frac : end + 1;
  }
  if (!digits) return std::nullopt;
  if (end < s.size() && (s[end] == 'e' || s[end] == 'E')) {
    size_t k = end + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    const size_t e = digit_run(s, k, 10);
    if (e == std::string::npos) return std::nullopt;
    end = e;
  }
  if (end != s.size()) return std::nullopt;
  const std::string clean = without_underscores(s.substr(i));
  double v = 0;
  const auto r = std::from_chars(clean.data(), clean.data() + clean.size(), v);
  if (r.ec == std::errc::result_out_of_range)
    v = clean.find_first_of("eE") != std::string::npos &&
                clean.find("-", clean.find_first_of("eE")) != std::string::npos
            ? 0.0
            : HUGE_VAL;
  return sign * v;
}

// Python's int(str, base): whitespace around, a sign, the base's prefix for 2, 8, 16.
std::optional<int64_t> parse_int(const std::string& text, int base) {
  const std::string s = text::strip(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  size_t i = s[0] == '+' || s[0] == '-' ? 1 : 0;
  const bool neg = s[0] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    if ((base == 16 && p == 'x') || (base == 8 && p == 'o') || (base == 2 && p == 'b')) {
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  const size_t end = digit_run(s, i, base);
  if (end != s.size()) return std::nullopt;
  const std::string digits = (neg ? "-" : "") + without_underscores(s.substr(i));
  int64_t v = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) fail("int() of '" + text + "': past 64 bits");
  return v;
}

// make_attrgetter: "a.b.0" read with getitem part by part (a digit-only part as an int).
Value attr_path(const Value& obj, const std::string& path, Guard& guard) {
  Value v = obj;
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(v, digits ? Value::integer(std::stoll(part)) : Value::string(part), guard);
    if (dot == std::string::npos) return v;
    from = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value::string(text::lower(v.str())) : v;
}

// The elements and their sort keys (an attribute path, lower-cased unless case_sensitive).
std::vector<std::pair<Value, Value>> keyed(const Value& seq, const Params& p, size_t case_i, size_t attr_i, Guard& g) {
  const bool cs = p.bool_or(case_i, false);
  const Value* attr = p.get(attr_i);
  std::vector<std::pair<Value, Value>> out;
  for (const Value& x : iterate(seq, g)) {
    Value k = attr != nullptr && !attr->is_none() ? attr_path(x, to_str(*attr, g), g) : x;
    out.emplace_back(sort_key(k, cs), x);
  }
  return out;
}

Value f_abs(const Value& v, CallArgs& a) {
  Params(a, "abs", {});
  if (v.kind() == Value::Kind::Float) return Value::number(std::fabs(v.as_float()));
  if (!v.is_int_like()) fail("bad operand type for abs(): '" + type_name(v) + "'");
  return v.as_int() < 0 ? unary_op('-', v) : Value::integer(v.as_int());
}

Value f_capitalize(const Value& v, CallArgs& a) {
  Params(a, "capitalize", {});
  return Value::string(text::capitalize(to_str(v, a.guard)));
}

Value f_length(const Value& v, CallArgs& a) {
  Params(a, "length", {});
  if (v.is_string()) a.guard.step_bytes(v.str().size());
  return Value::integer(static_cast<int64_t>(length(v)));
}

Value f_default(const Value& v, CallArgs& a) {
  const Params p(a, "default", {"default_value", "boolean"});
  if (v.is_undefined() || (p.bool_or(1, false) && !truthy(v))) return p.get_or(0, Value::string(""));
  return v;
}

Value f_dictsort(const Value& v, CallArgs& a) {
  const Params p(a, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is_mapping()) fail("dictsort: expected a dict, got " + type_name(v));
  const std::string by = p.string_or(1, "key", a.guard);
  if (by != "key" && by != "value") fail("You can only sort by either 'key' or 'value'");
  const bool cs = p.bool_or(0, false), rev = p.bool_or(2, false);
  std::vector<std::pair<Value, Value>> items;
  for (const auto& [k, x] : v.dict().items)
    items.emplace_back(sort_key(by == "key" ? k : x, cs), Value::tuple({k, x}, a.guard));
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? less(y.first, x.first, a.guard) : less(x.first, y.first, a.guard);
  });
  std::vector<Value> out;
  for (auto& kv : items) out.push_back(std::move(kv.second));
  return Value::list(std::move(out), a.guard);
}

Value f_first(const Value& v, CallArgs& a) {
  Params(a, "first", {});
  const std::vector<Value> items = iterate(v, a.guard);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, CallArgs& a) {
  Params(a, "last", {});
  const std::vector<Value> items = iterate(v, a.guard);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(const Value& v, CallArgs& a) {
  const Params p(a, "float", {"default"});
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string())
    if (const auto f = parse_float(v.str())) return Value::number(*f);
  return p.get_or(0, Value::number(0.0));
}

Value f_int(const Value& v, CallArgs& a) {
  const Params p(a, "int", {"default", "base"});
  const int64_t base = p.int_or(1, 10);
  if (base < 2 || base > 36) fail("int() base must be >= 2 and <= 36");
  std::optional<double> f;
  if (v.is_int_like()) return Value::integer(v.as_int());
  if (v.is_string()) {
    if (const auto i = parse_int(v.str(), static_cast<int>(base))) return Value::integer(*i);
    f = parse_float(v.str());
  } else if (v.kind() == Value::Kind::Float) {
    f = v.as_float();
  }
  if (f && std::isinf(*f)) fail("cannot convert float infinity to integer");
  if (f && !std::isnan(*f)) {
    if (std::fabs(*f) >= 9.2e18) fail("int() of a float past 64 bits");
    return Value::integer(static_cast<int64_t>(std::trunc(*f)));
  }
  return p.get_or(0, Value::integer(0));
}

Value f_indent(const Value& v, CallArgs& a) {
  const Params p(a, "indent", {"width", "first", "blank"});
  const std::string ind = p.get(0) != nullptr && p.get(0)->is_string()
                              ? p.get(0)->str()
                              : std::string(static_cast<size_t>(std::clamp<int64_t>(p.int_or(0, 4), 0, 1024)), ' ');
  const std::vector<std::string> lines = text::split_lines(to_str(v, a.guard) + "\n", false);
  const bool blank = p.bool_or(2, false);
  std::string out = p.bool_or(1, false) ? ind : "";
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += (blank || !lines[i].empty()) ? "\n" + ind : "\n";
    out += lines[i];
    a.guard.check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_items(const Value& v, CallArgs& a) {
  Params(a, "items", {});
  if (v.is_undefined()) return Value::list({}, a.guard);
  if (!v.is_mapping()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({k, x}, a.guard));
  a.guard.step(out.size());
  return Value::list(std::move(out), a.guard);
}

Value f_join(const Value& v, CallArgs& a) {
  const Params p(a, "join", {"d", "attribute"});
  const std::string sep = p.string_or(0, "", a.guard);
  const Value* attr = p.get(1);
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v, a.guard)) {
    if (!first) out += sep;
    first = false;
    append_str(out, attr != nullptr && !attr->is_none() ? attr_path(x, to_str(*attr, a.guard), a.guard) : x, a.guard);
    a.guard.check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_list(const Value& v, CallArgs& a) {
  Params(a, "list", {});
  return Value::list(iterate(v, a.guard), a.guard);
}

Value f_lower(const Value& v, CallArgs& a) {
  Params(a, "lower", {});
  return Value::string(text::lower(to_str(v, a.guard)));
}

Value f_upper(const Value& v, CallArgs& a) {
  Params(a, "upper", {});
  return Value::string(text::upper(to_str(v, a.guard)));
}

Value f_map(const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const bool by_attr = a.args.empty() && std::any_of(a.kwargs.begin(), a.kwargs.end(),
                                                     [](const auto& kv) { return kv.first == "attribute"; });
  if (by_attr) {
    const Params p(a, "map", {"attribute", "default"});
    const std::string path = p.string_or(0, "", a.guard);
    for (const Value& x : iterate(v, a.guard)) {
      Value y = attr_path(x, path, a.guard);
      out.push_back(y.is_undefined() && p.get(1) != nullptr ? *p.get(1) : y);
    }
    return Value::list(std::move(out), a.guard);
  }
  if (a.args.empty() || !a.args[0].is_string()) fail("map() needs a filter name or attribute=");
  const std::string name = a.args[0].str();
  if (!has_filter(name)) fail(missing_filter_message(name));
  for (const Value& x : iterate(v, a.guard)) {
    CallArgs inner{std::vector<Value>(a.args.begin() + 1, a.args.end()), a.kwargs, a.guard};
    out.push_back(apply_filter(name, x, inner));
  }
  return Value::list(std::move(out), a.guard);
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  const Params p(a, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  const auto items = keyed(v, p, 0, 1, a.guard);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i)
    if (want_max ? less(items[best].first, items[i].first, a.guard) : less(items[i].first, items[best].first, a.guard))
      best = i;
  return items[best].second;
}
Value f_max(const Value& v, CallArgs& a) { return min_max(v, a, true); }
Value f_min(const Value& v, CallArgs& a) { return min_max(v, a, false); }

// select / reject / selectattr / rejectattr: the elements (or their attribute) passing the test
// named by the first argument (truthiness without one), or failing it.
Value select_impl(const Value& v, CallArgs& a, bool keep, bool by_attr) {
  size_t off = 0;
  std::string path;
  if (by_attr) {
    if (a.args.empty()) fail("selectattr / rejectattr need an attribute");
    path = to_str(a.args[0], a.guard);
    off = 1;
  }
  std::string test;
  if (a.args.size() > off) {
    test = to_str(a.args[off], a.guard);
    if (!has_test(test)) fail(missing_test_message(test));
  }
  std::vector<Value> out;
  for (const Value& x : iterate(v, a.guard)) {
    const Value subject = by_attr ? attr_path(x, path, a.guard) : x;
    bool pass;
    if (test.empty()) {
      pass = truthy(subject);
    } else {
      CallArgs targs{std::vector<Value>(a.args.begin() + static_cast<long>(off) + 1, a.args.end()), a.kwargs, a.guard};
      pass = apply_test(test, subject, targs);
    }
    if (pass == keep) out.push_back(x);
  }
  return Value::list(std::move(out), a.guard);
}
Value f_select(const Value& v, CallArgs& a) { return select_impl(v, a, true, false); }
Value f_reject(const Value& v, CallArgs& a) { return select_impl(v, a, false, false); }
Value f_selectattr(const Value& v, CallArgs& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, CallArgs& a) { return select_impl(v, a, false, true); }

Value f_replace(const Value& v, CallArgs& a) {
  const Params p(a, "replace", {"old", "new", "count"});
  if (p.get(0) == nullptr || p.get(1) == nullptr) fail("replace() needs old and new");
  const std::string s = to_str(v, a.guard), old = to_str(*p.get(0), a.guard), with = to_str(*p.get(1), a.guard);
  CallArgs m{{Value::string(old), Value::string(with), Value::integer(p.int_or(2, -1))}, {}, a.guard};
  return get_attr(Value::string(s), "replace", a.guard).fn().fn(m);
}

Value f_reverse(const Value& v, CallArgs& a) {
  Params(a, "reverse", {});
  if (v.is_string()) {
    const std::vector<size_t> at = text::code_point_offsets(v.str());
    std::string out;
    for (size_t k = at.size() - 1; k > 0; --k) out.append(v.str(), at[k - 1], at[k] - at[k - 1]);
    return Value::string(std::move(out));
  }
  std::vector<Value> items = iterate(v, a.guard);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items), a.guard);
}

Value f_sort(const Value& v, CallArgs& a) {
  const Params p(a, "sort", {"reverse", "case_sensitive", "attribute"});
  auto items = keyed(v, p, 1, 2, a.guard);
  const bool rev = p.bool_or(0, false);
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? less(y.first, x.first, a.guard) : less(x.first, y.first, a.guard);
  });
  std::vector<Value> out;
  for (auto& kv : items) out.push_back(std::move(kv.second));
  return Value::list(std::move(out), a.guard);
}

Value f_string(const Value& v, CallArgs& a) {
  Params(a, "string", {});
  return Value::string(to_str(v, a.guard));
}

Value f_safe(const Value& v, CallArgs& a) {
  Params(a, "safe", {});
  return Value::string(to_str(v, a.guard));
}

Value f_escape(const Value& v, CallArgs& a) {
  Params(a, "escape", {});
  std::string out;
  for (char c : to_str(v, a.guard)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  a.guard.check_size(out.size());
  return Value::string(std::move(out));
}

Value f_sum(const Value& v, CallArgs& a) {
  const Params p(a, "sum", {"attribute", "start"});
  Value total = p.get_or(1, Value::integer(0));
  const Value* attr = p.get(0);
  for (const Value& x : iterate(v, a.guard))
    total = binary_op("+", total,
                      attr != nullptr && !attr->is_none() ? attr_path(x, to_str(*attr, a.guard), a.guard) : x, a.guard);
  return total;
}

// Jinja's title: split on runs of "-", whitespace, "(", "{", "[", "<"; each piece's first code
// point upper-cased, the rest lower-cased.
Value f_title(const Value& v, CallArgs& a) {
  Params(a, "title", {});
  const std::string s = to_str(v, a.guard);
  std::string out;
  auto is_sep = [&](size_t i, size_t* len) {
    const text::CodePoint c = text::decode_at(s, i);
    *len = c.len;
    return c.cp == '-' || c.cp == '(' || c.cp == '{' || c.cp == '[' || c.cp == '<' ||
           (text::is_space(c.cp) && !(c.len == 1 && c.cp >= 0x80));
  };
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const bool sep = is_sep(i, &len);
    size_t j = i + len;
    size_t l2 = 0;
    while (j < s.size() && is_sep(j, &l2) == sep) j += l2;
    const std::string piece = s.substr(i, j - i);
    out += sep ? piece : text::upper(piece.substr(0, len)) + text::lower(piece.substr(len));
    i = j;
  }
  return Value::string(std::move(out));
}

Value f_tojson(const Value& v, CallArgs& a) {
  const Params p(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle style;
  style.ensure_ascii = p.bool_or(0, false);
  if (p.get(1) != nullptr && !p.get(1)->is_none()) {
    style.indent_set = true;
    if (p.get(1)->is_string())
      style.indent = p.get(1)->str();
    else
      style.indent.assign(static_cast<size_t>(std::clamp<int64_t>(p.int_or(1, 0), 0, 64)), ' ');
  }
  style.item_sep = style.indent_set ? "," : ", ";
  if (const Value* sep = p.get(2); sep != nullptr && !sep->is_none()) {
    if (!sep->is_sequence() || sep->items().size() != 2 || !sep->items()[0].is_string() || !sep->items()[1].is_string())
      fail("tojson(): separators must be a pair of strings");
    style.item_sep = sep->items()[0].str();
    style.key_sep = sep->items()[1].str();
  }
  style.sort_keys = p.bool_or(3, false);
  std::string out;
  append_json(out, v, style, a.guard);
  return Value::string(std::move(out));
}

Value f_trim(const Value& v, CallArgs& a) {
  const Params p(a, "trim", {"chars"});
  const std::string s = to_str(v, a.guard);
  if (p.get(0) == nullptr || p.get(0)->is_none()) return Value::string(text::strip(s, nullptr, true, true));
  const std::string chars = to_str(*p.get(0), a.guard);
  return Value::string(text::strip(s, &chars, true, true));
}

Value f_unique(const Value& v, CallArgs& a) {
  const Params p(a, "unique", {"case_sensitive", "attribute"});
  std::vector<Value> seen, out;
  for (const auto& kx : keyed(v, p, 0, 1, a.guard)) {
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, kx.first, a.guard); })) continue;
    seen.push_back(kx.first);
    out.push_back(kx.second);
  }
  return Value::list(std::move(out), a.guard);
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> table = {{"abs", f_abs},
                                                                  {"capitalize", f_capitalize},
                                                                  {"count", f_length},
                                                                  {"d", f_default},
                                                                  {"default", f_default},
                                                                  {"dictsort", f_dictsort},
                                                                  {"e", f_escape},
                                                                  {"escape", f_escape},
                                                                  {"first", f_first},
                                                                  {"float", f_float},
                                                                  {"indent", f_indent},
                                                                  {"int", f_int},
                                                                  {"items", f_items},
                                                                  {"join", f_join},
                                                                  {"last", f_last},
                                                                  {"length", f_length},
                                                                  {"list", f_list},
                                                                  {"lower", f_lower},
                                                                  {"map", f_map},
                                                                  {"max", f_max},
                                                                  {"min", f_min},
                                                                  {"reject", f_reject},
                                                                  {"rejectattr", f_rejectattr},
                                                                  {"replace", f_replace},
                                                                  {"reverse", f_reverse},
                                                                  {"safe", f_safe},
                                                                  {"select", f_select},
                                                                  {"selectattr", f_selectattr},
                                                                  {"sort", f_sort},
                                                                  {"string", f_string},
                                                                  {"sum", f_sum},
                                                                  {"title", f_title},
                                                                  {"tojson", f_tojson},
                                                                  {"trim", f_trim},
                                                                  {"unique", f_unique},
                                                                  {"upper", f_upper}};
  return table;
}

const Value& test_arg(CallArgs& a, const char* name) {
  const Params p(a, name, {"other"});
  if (p.get(0) == nullptr) fail(std::string("the test '") + name + "' needs an argument");
  return *p.get(0);
}

bool no_args(CallArgs& a, const char* name) {
  Params(a, name, {});
  return true;
}

bool t_defined(const Value& v, CallArgs& a) { return no_args(a, "defined") && !v.is_undefined(); }
bool t_undefined(const Value& v, CallArgs& a) { return no_args(a, "undefined") && v.is_undefined(); }
bool t_none(const Value& v, CallArgs& a) { return no_args(a, "none") && v.is_none(); }
bool t_boolean(const Value& v, CallArgs& a) { return no_args(a, "boolean") && v.kind() == Value::Kind::Bool; }
bool t_true(const Value& v, CallArgs& a) { return no_args(a, "true") && v.kind() == Value::Kind::Bool && v.as_bool(); }
bool t_false(const Value& v, CallArgs& a) {
  return no_args(a, "false") && v.kind() == Value::Kind::Bool && !v.as_bool();
}
bool t_integer(const Value& v, CallArgs& a) { return no_args(a, "integer") && v.kind() == Value::Kind::Int; }
bool t_float(const Value& v, CallArgs& a) { return no_args(a, "float") && v.kind() == Value::Kind::Float; }
bool t_number(const Value& v, CallArgs& a) { return no_args(a, "number") && v.is_number(); }
bool t_string(const Value& v, CallArgs& a) { return no_args(a, "string") && v.is_string(); }
bool t_mapping(const Value& v, CallArgs& a) { return no_args(a, "mapping") && v.is_mapping(); }
bool t_callable(const Value& v, CallArgs& a) { return no_args(a, "callable") && v.kind() == Value::Kind::Function; }
bool t_escaped(const Value&, CallArgs& a) { return no_args(a, "escaped") && false; }
// Python: iter(x) works (str, list, tuple, dict, and Jinja's undefined); len(x) and x[...] exist.
bool t_iterable(const Value& v, CallArgs& a) {
  return no_args(a, "iterable") && (v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping());
}
bool t_sequence(const Value& v, CallArgs& a) {
  return no_args(a, "sequence") && (v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping());
}
bool t_lower(const Value& v, CallArgs& a) { return no_args(a, "lower") && text::is_lower(to_str(v, a.guard)); }
bool t_upper(const Value& v, CallArgs& a) { return no_args(a, "upper") && text::is_upper(to_str(v, a.guard)); }
bool t_odd(const Value& v, CallArgs& a) {
  return no_args(a, "odd") && equal(binary_op("%", v, Value::integer(2), a.guard), Value::integer(1), a.guard);
}
bool t_even(const Value& v, CallArgs& a) {
  return no_args(a, "even") && equal(binary_op("%", v, Value::integer(2), a.guard), Value::integer(0), a.guard);
}
bool t_divisibleby(const Value& v, CallArgs& a) {
  return equal(binary_op("%", v, test_arg(a, "divisibleby"), a.guard), Value::integer(0), a.guard);
}
bool t_eq(const Value& v, CallArgs& a) { return equal(v, test_arg(a, "eq"), a.guard); }
bool t_ne(const Value& v, CallArgs& a) { return !equal(v, test_arg(a, "ne"), a.guard); }
bool t_lt(const Value& v, CallArgs& a) { return less(v, test_arg(a, "lt"), a.guard); }
bool t_gt(const Value& v, CallArgs& a) { return less(test_arg(a, "gt"), v, a.guard); }
bool t_le(const Value& v, CallArgs& a) {
  const Value& o = test_arg(a, "le");
  return less(v, o, a.guard) || equal(v, o, a.guard);
}
bool t_ge(const Value& v, CallArgs& a) {
  const Value& o = test_arg(a, "ge");
  return less(o, v, a.guard) || equal(v, o, a.guard);
}
bool t_in(const Value& v, CallArgs& a) { return contains(test_arg(a, "in"), v, a.guard); }
// Python's `is`: one object. Scalars compare by value here (CPython shares small ints and
// interned strings, so `is` on them is an accident of the implementation).
bool t_sameas(const Value& v, CallArgs& a) {
  const Value& o = test_arg(a, "sameas");
  if (v.kind() != o.kind()) return false;
  if (v.is_sequence()) return &v.items() == &o.items();
  if (v.kind() == Value::Kind::Dict || v.kind() == Value::Kind::Namespace) return &v.dict() == &o.dict();
  return equal(v, o, a.guard);
}
bool t_filter(const Value& v, CallArgs& a) { return no_args(a, "filter") && v.is_string() && has_filter(v.str()); }
bool t_test(const Value& v, CallArgs& a) { return no_args(a, "test") && v.is_string() && has_test(v.str()); }

const std::unordered_map<std::string, TestFn>& test_table() {
  static const std::unordered_map<std::string, TestFn> table = {{"defined", t_defined},
                                                                {"undefined", t_undefined},
                                                                {"none", t_none},
                                                                {"boolean", t_boolean},
                                                                {"true", t_true},
                                                                {"false", t_false},
                                                                {"integer", t_integer},
                                                                {"float", t_float},
                                                                {"number", t_number},
                                                                {"string", t_string},
                                                                {"mapping", t_mapping},
                                                                {"callable", t_callable},
                                                                {"escaped", t_escaped},
                                                                {"iterable", t_iterable},
                                                                {"sequence", t_sequence},
                                                                {"lower", t_lower},
                                                                {"upper", t_upper},
                                                                {"odd", t_odd},
                                                                {"even", t_even},
                                                                {"divisibleby", t_divisibleby},
                                                                {"eq", t_eq},
                                                                {"equalto", t_eq},
                                                                {"==", t_eq},
                                                                {"ne", t_ne},
                                                                {"!=", t_ne},
                                                                {"lt", t_lt},
                                                                {"lessthan", t_lt},
                                                                {"<", t_lt},
                                                                {"gt", t_gt},
                                                                {"greaterthan", t_gt},
                                                                {">", t_gt},
                                                                {"le", t_le},
                                                                {"<=", t_le},
                                                                {"ge", t_ge},
                                                                {">=", t_ge},
                                                                {"in", t_in},
                                                                {"sameas", t_sameas},
                                                                {"filter", t_filter},
                                                                {"test", t_test}};
  return table;
}

// ---- globals ----

Value range_fn(CallArgs& a) {
  const Params p(a, "range", {"start", "stop", "step"});
  for (const Value& x : a.args)
    if (!x.is_int_like()) fail("range(): '" + type_name(x) + "' object cannot be interpreted as an integer");
  if (a.args.empty() || !a.kwargs.empty()) fail("range() takes 1 to 3 positional arguments");
  const int64_t start = a.args.size() == 1 ? 0 : a.args[0].as_int();
  const int64_t stop = a.args.size() == 1 ? a.args[0].as_int() : a.args[1].as_int();
  const int64_t step = a.args.size() == 3 ? a.args[2].as_int() : 1;
  if (step == 0) fail("range() arg 3 must not be zero");
  const long double n = step > 0 ? (static_cast<long double>(stop) - start + step - 1) / step
                                 : (static_cast<long double>(start) - stop - step - 1) / -step;
  if (n > 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(i));
  a.guard.step(out.size());
  return Value::list(std::move(out), a.guard);
}

// dict(*args, **kwargs): a mapping or pairs, then the keywords.
std::vector<std::pair<Value, Value>> dict_items(CallArgs& a, const char* fn) {
  if (a.args.size() > 1) fail(std::string(fn) + "() takes at most 1 positional argument");
  std::vector<std::pair<Value, Value>> items;
  if (!a.args.empty()) {
    const Value& src = a.args[0];
    if (src.is_mapping()) {
      items = src.dict().items;
    } else {
      for (const Value& pair : iterate(src, a.guard)) {
        const std::vector<Value> kv = iterate(pair, a.guard);
        if (kv.size() != 2) fail(std::string(fn) + "(): each element must be a pair");
        items.emplace_back(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kwargs) items.emplace_back(Value::string(k), v);
  return items;
}

Value namespace_fn(CallArgs& a) {
  auto items = dict_items(a, "namespace");
  for (const auto& kv : items)
    if (kv.first.is_string() && !kv.first.str().empty() && kv.first.str()[0] == '_')
      fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + kv.first.str() +
           "'");
  return Value::make_namespace(std::move(items), a.guard);
}

Value dict_fn(CallArgs& a) { return Value::dict(dict_items(a, "dict"), a.guard); }

Value raise_fn(CallArgs& a) {
  const Params p(a, "raise_exception", {"message"});
  fail(kRaisedPrefix + p.string_or(0, "", a.guard));
}

Value strftime_fn(CallArgs& a, std::optional<std::time_t> fixed_now) {
  const Params p(a, "strftime_now", {"format"});
  if (p.get(0) == nullptr || !p.get(0)->is_string()) fail("strftime_now() needs a format string");
  const std::string& fmt = p.get(0)->str();
  if (fmt.size() > 256) fail("strftime_now(): the format is longer than 256 bytes");
  const std::time_t t = fixed_now ? *fixed_now : std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::string buf(4096, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(std::move(buf));
}

}  // namespace filters_impl

bool has_filter(const std::string& name) { return filters_impl::filter_table().count(name) > 0; }
bool has_test(const std::string& name) { return filters_impl::test_table().count(name) > 0; }

std::string missing_filter_message(const std::string& name) {
  static const char* const kJinja[] = {"attr",     "batch",     "center", "filesizeformat", "forceescape", "format",
                                       "groupby",  "pprint",    "random", "round",          "slice",       "striptags",
                                       "truncate", "urlencode", "urlize", "wordcount",      "wordwrap",    "xmlattr"};
  for (const char* j : kJinja)
    if (name == j) return "the filter '" + name + "' is not supported by this interpreter";
  return "no filter named '" + name + "'";
}

std::string missing_test_message(const std::string& name) { return "no test named '" + name + "'"; }

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  const auto& table = filters_impl::filter_table();
  const auto it = table.find(name);
  if (it == table.end()) fail(missing_filter_message(name));
  args.guard.step();
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& input, CallArgs& args) {
  const auto& table = filters_impl::test_table();
  const auto it = table.find(name);
  if (it == table.end()) fail(missing_test_message(name));
  args.guard.step();
  return it->second(input, args);
}

std::vector<std::pair<std::string, Value>> global_functions(std::optional<std::time_t> fixed_now) {
  return {{"range", Value::function("range", filters_impl::range_fn)},
          {"namespace", Value::function("namespace", filters_impl::namespace_fn)},
          {"dict", Value::function("dict", filters_impl::dict_fn)},
          {"raise_exception", Value::function("raise_exception", filters_impl::raise_fn)},
          {"strftime_now", Value::function("strftime_now", [fixed_now](CallArgs& a) {
             return filters_impl::strftime_fn(a, fixed_now);
           })}};
}

}  // namespace wm::llm::jinja
