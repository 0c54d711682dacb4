// Attribute and item access, slices, and the methods of str and dict, as Jinja's immutable
// sandbox gives them to a template (llmkv/jinja_builtins.h).
#include <algorithm>

#include "llmkv/jinja_builtins.h"
#include "llmkv/jinja_text.h"

namespace wm::llm::jinja {

Params::Params(const CallArgs& args, std::string function, std::vector<const char*> names)
    : function_(std::move(function)), names_(std::move(names)), bound_(names_.size(), nullptr) {
  if (args.args.size() > names_.size())
    fail(function_ + "() takes at most " + std::to_string(names_.size()) + " argument(s), " +
         std::to_string(args.args.size()) + " given");
  for (size_t i = 0; i < args.args.size(); ++i) bound_[i] = &args.args[i];
  for (const auto& [key, value] : args.kwargs) {
    size_t i = 0;
    while (i < names_.size() && key != names_[i]) ++i;
    if (i == names_.size()) fail(function_ + "() got an unexpected keyword argument '" + key + "'");
    if (bound_[i] != nullptr) fail(function_ + "() got multiple values for argument '" + key + "'");
    bound_[i] = &value;
  }
}

int64_t Params::int_or(size_t i, int64_t dflt) const {
  if (bound_[i] == nullptr || bound_[i]->is_none()) return dflt;
  if (!bound_[i]->is_int_like()) fail(function_ + "(): " + names_[i] + " must be an int, not " + type_name(*bound_[i]));
  return bound_[i]->as_int();
}

bool Params::bool_or(size_t i, bool dflt) const { return bound_[i] == nullptr ? dflt : truthy(*bound_[i]); }

std::string Params::string_or(size_t i, std::string dflt, Guard& guard) const {
  return bound_[i] == nullptr ? std::move(dflt) : to_str(*bound_[i], guard);
}

namespace access_impl {

[[noreturn]] void undefined_used(const Value& v) {
  fail(v.str().empty() ? std::string("an undefined value was used") : v.str());
}

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

const char* const kStrMethods[] = {"strip",    "lstrip",  "rstrip",  "split",   "rsplit",     "startswith",
                                   "endswith", "lower",   "upper",   "title",   "capitalize", "replace",
                                   "find",     "rfind",   "count",   "join",    "splitlines", "format",
                                   "isdigit",  "isspace", "isalpha", "isalnum", "islower",    "isupper"};
// Methods Python has and this interpreter refuses: the mutating ones of list and dict (as the
// immutable sandbox refuses them) and the str / list / dict methods not implemented here.
const char* const kOtherStrMethods[] = {
    "casefold",     "center",    "encode",      "expandtabs", "format_map", "index",     "isascii",   "isdecimal",
    "isidentifier", "isnumeric", "isprintable", "istitle",    "ljust",      "maketrans", "partition", "removeprefix",
    "removesuffix", "rindex",    "rjust",       "rpartition", "swapcase",   "translate", "zfill"};
const char* const kListMethods[] = {"append", "clear", "copy",   "count",   "extend", "index",
                                    "insert", "pop",   "remove", "reverse", "sort"};
const char* const kOtherDictMethods[] = {"clear", "copy", "fromkeys", "pop", "popitem", "setdefault", "update"};

bool listed(const char* const* begin, const char* const* end, const std::string& name) {
  return std::any_of(begin, end, [&](const char* m) { return name == m; });
}

Value refused_method(const Value& obj, const std::string& name) {
  return Value::undefined("the method '" + name + "' of '" + type_name(obj) + "' objects is not supported here");
}

Value str_method(const std::string& self, const std::string& name, CallArgs& a);
Value dict_method(const Value& self, const std::string& name, CallArgs& a);

Value bound_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    const std::string self = obj.str();
    return Value::function("str." + name, [self, name](CallArgs& a) { return str_method(self, name, a); });
  }
  return Value::function("dict." + name, [obj, name](CallArgs& a) { return dict_method(obj, name, a); });
}

Value attr_of(const Value& obj, const std::string& name) {
  if (!name.empty() && name[0] == '_') return Value::undefined("access to '" + name + "' is unsafe");
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      undefined_used(obj);
    case Value::Kind::Dict: {
      if (name == "items" || name == "keys" || name == "values" || name == "get") return bound_method(obj, name);
      if (listed(std::begin(kOtherDictMethods), std::end(kOtherDictMethods), name)) return refused_method(obj, name);
      const Value* v = obj.dict().find(name);
      return v != nullptr ? *v : no_attribute(obj, name);
    }
    case Value::Kind::Namespace: {
      const Value* v = obj.dict().find(name);
      return v != nullptr ? *v : no_attribute(obj, name);
    }
    case Value::Kind::String:
      if (listed(std::begin(kStrMethods), std::end(kStrMethods), name)) return bound_method(obj, name);
      if (listed(std::begin(kOtherStrMethods), std::end(kOtherStrMethods), name)) return refused_method(obj, name);
      return no_attribute(obj, name);
    case Value::Kind::List:
    case Value::Kind::Tuple:
      if (listed(std::begin(kListMethods), std::end(kListMethods), name)) return refused_method(obj, name);
      return no_attribute(obj, name);
    default:
      return no_attribute(obj, name);
  }
}

// Python's index into n elements (negative from the end); -1 when out of range.
int64_t normalize_index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  return i >= 0 && static_cast<size_t>(i) < n ? i : -1;
}

}  // namespace access_impl

Value get_attr(const Value& obj, const std::string& name, Guard& guard) {
  guard.step();
  return access_impl::attr_of(obj, name);
}

Value get_item(const Value& obj, const Value& key, Guard& guard) {
  guard.step();
  using access_impl::normalize_index;
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      access_impl::undefined_used(obj);
    case Value::Kind::Dict: {
      if (key.kind() == Value::Kind::List || key.kind() == Value::Kind::Dict) break;  // unhashable
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    }
    case Value::Kind::List:
    case Value::Kind::Tuple:
      if (key.is_int_like()) {
        const int64_t i = normalize_index(key.as_int(), obj.items().size());
        return i >= 0 ? obj.items()[static_cast<size_t>(i)] : Value::undefined("list index out of range");
      }
      break;
    case Value::Kind::String:
      if (key.is_int_like()) {
        guard.step_bytes(obj.str().size());
        const std::vector<size_t> at = text::code_point_offsets(obj.str());
        const int64_t i = normalize_index(key.as_int(), at.size() - 1);
        if (i < 0) return Value::undefined("string index out of range");
        return Value::string(obj.str().substr(at[i], at[i + 1] - at[i]));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return access_impl::attr_of(obj, key.str());
  return Value::undefined("'" + type_name(obj) + " object' has no element " + to_str(key, guard));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, Guard& guard) {
  guard.step();
  if (obj.is_undefined()) access_impl::undefined_used(obj);
  if (!obj.is_string() && !obj.is_sequence())
    return Value::undefined("'" + type_name(obj) + "' object is not sliceable");
  for (const Value* b : {&start, &stop, &step})
    if (!b->is_none() && !b->is_int_like()) return Value::undefined("slice indices must be integers or None");
  const int64_t st = step.is_none() ? 1 : step.as_int();
  if (st == 0) fail("slice step cannot be zero");
  std::vector<size_t> at;
  if (obj.is_string()) {
    guard.step_bytes(obj.str().size());
    at = text::code_point_offsets(obj.str());
  }
  const auto n = static_cast<int64_t>(obj.is_string() ? at.size() - 1 : obj.items().size());
  const int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
  auto adjust = [&](const Value& b, int64_t dflt) {
    if (b.is_none()) return dflt;
    int64_t i = b.as_int();
    if (i < 0) i += n;
    return std::clamp(i, lower, upper);
  };
  const int64_t from = adjust(start, st > 0 ? lower : upper), to = adjust(stop, st > 0 ? upper : lower);
  std::string s;
  std::vector<Value> items;
  for (int64_t i = from; st > 0 ? i < to : i > to; i += st) {
    guard.step();
    if (obj.is_string())
      s.append(obj.str(), at[i], at[i + 1] - at[i]);
    else
      items.push_back(obj.items()[static_cast<size_t>(i)]);
  }
  if (obj.is_string()) return Value::string(std::move(s));
  return obj.kind() == Value::Kind::Tuple ? Value::tuple(std::move(items), guard)
                                          : Value::list(std::move(items), guard);
}

namespace access_impl {

const std::string& str_arg(const Value* v, const std::string& fn) {
  if (v == nullptr || !v->is_string())
    fail(fn + "() argument must be str, not " + (v == nullptr ? std::string("nothing") : type_name(*v)));
  return v->str();
}

// str.split / str.rsplit on whitespace runs (sep None) or on sep, at most maxsplit times (< 0: all).
std::vector<Value> split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right, Guard& guard);

std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count,
                    Guard& guard) {
  std::string out;
  if (old.empty()) {
    const std::vector<size_t> at = text::code_point_offsets(s);
    for (size_t k = 0; k + 1 < at.size(); ++k) {
      if (count < 0 || static_cast<int64_t>(k) < count) out += with;
      out.append(s, at[k], at[k + 1] - at[k]);
      guard.check_size(out.size());
    }
    if (count < 0 || static_cast<int64_t>(at.size() - 1) < count) out += with;
    return out;
  }
  size_t from = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(old, from);
    if (hit == std::string::npos) break;
    out.append(s, from, hit - from);
    out += with;
    guard.check_size(out.size());
    from = hit + old.size();
  }
  out.append(s, from, std::string::npos);
  guard.check_size(out.size());
  return out;
}

Value format(const std::string& fmt, CallArgs& a);

Value str_predicate(const std::string& s, const std::string& name) {
  if (name == "islower") return Value::boolean(text::is_lower(s));
  if (name == "isupper") return Value::boolean(text::is_upper(s));
  if (s.empty()) return Value::boolean(false);
  for (size_t i = 0; i < s.size();) {
    const text::CodePoint c = text::decode_at(s, i);
    i += c.len;
    const uint32_t x = c.cp;
    const bool digit = x >= '0' && x <= '9';
    const bool alpha = (x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z');
    bool ok = name == "isdigit"   ? digit
              : name == "isalpha" ? alpha
              : name == "isalnum" ? digit || alpha
                                  : text::is_space(x);
    if (x >= 0x80 && name != "isspace") fail("str." + name + "() on non-ASCII text is not supported here");
    if (!ok) return Value::boolean(false);
  }
  return Value::boolean(true);
}

Value str_method_rest(const std::string& self, const std::string& name, CallArgs& a);

Value str_method(const std::string& self, const std::string& name, CallArgs& a) {
  Guard& g = a.guard;
  g.step_bytes(self.size());
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Params p(a, "str." + name, {"chars"});
    const Value* chars = p.get(0) != nullptr && !p.get(0)->is_none() ? p.get(0) : nullptr;
    const std::string* set = chars != nullptr ? &str_arg(chars, p.function()) : nullptr;
    return Value::string(text::strip(self, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Params p(a, "str." + name, {"sep", "maxsplit"});
    const Value* sep = p.get(0) != nullptr && !p.get(0)->is_none() ? p.get(0) : nullptr;
    if (sep != nullptr) str_arg(sep, p.function());
    return Value::list(split(self, sep, p.int_or(1, -1), name == "rsplit", g), g);
  }
  if (name == "splitlines") {
    const Params p(a, "str.splitlines", {"keepends"});
    std::vector<Value> lines;
    for (std::string& l : text::split_lines(self, p.bool_or(0, false))) lines.push_back(Value::string(std::move(l)));
    return Value::list(std::move(lines), g);
  }
  if (name == "startswith" || name == "endswith") {
    const Params p(a, "str." + name, {"prefix"});
    const Value* arg = p.get(0);
    std::vector<Value> options =
        arg != nullptr && arg->kind() == Value::Kind::Tuple ? arg->items() : std::vector<Value>{};
    if (options.empty() && arg != nullptr) options.push_back(*arg);
    for (const Value& o : options) {
      const std::string& x = str_arg(&o, p.function());
      const bool hit =
          x.size() <= self.size() && (name == "startswith" ? self.compare(0, x.size(), x) == 0
                                                           : self.compare(self.size() - x.size(), x.size(), x) == 0);
      if (hit) return Value::boolean(true);
    }
    if (options.empty()) str_arg(nullptr, p.function());
    return Value::boolean(false);
  }
  return str_method_rest(self, name, a);
}

Value str_method_rest(const std::string& self, const std::string& name, CallArgs& a) {
  Guard& g = a.guard;
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize") {
    const Params p(a, "str." + name, {});
    if (name == "lower") return Value::string(text::lower(self));
    if (name == "upper") return Value::string(text::upper(self));
    if (name == "capitalize") return Value::string(text::capitalize(self));
    std::string out;  // str.title(): a letter after a non-letter is upper-cased, the others lower-cased
    bool prev_cased = false;
    for (size_t i = 0; i < self.size();) {
      const size_t n = text::decode_at(self, i).len;
      const std::string ch = self.substr(i, n);
      const std::string up = text::upper(ch), low = text::lower(ch);
      out += prev_cased ? low : up;
      prev_cased = up != low || text::is_lower(ch) || text::is_upper(ch);
      i += n;
    }
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    const Params p(a, "str.replace", {"old", "new", "count"});
    return Value::string(
        replace(self, str_arg(p.get(0), p.function()), str_arg(p.get(1), p.function()), p.int_or(2, -1), g));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    const Params p(a, "str." + name, {"sub"});
    const std::string& sub = str_arg(p.get(0), p.function());
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(text::code_point_count(self) + 1));
      int64_t n = 0;
      for (size_t at = self.find(sub); at != std::string::npos; at = self.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t at = name == "find" ? self.find(sub) : self.rfind(sub);
    return Value::integer(at == std::string::npos ? -1
                                                  : static_cast<int64_t>(text::code_point_count(self.substr(0, at))));
  }
  if (name == "join") {
    const Params p(a, "str.join", {"iterable"});
    if (p.get(0) == nullptr) fail("str.join() takes exactly one argument");
    std::string out;
    size_t k = 0;
    for (const Value& x : iterate(*p.get(0), g)) {
      if (!x.is_string())
        fail("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(x) + " found");
      if (k++ > 0) out += self;
      out += x.str();
      g.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return format(self, a);
  Params(a, "str." + name, {});
  return str_predicate(self, name);
}

std::vector<Value> split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right, Guard& guard) {
  std::vector<std::string> parts;
  if (sep == nullptr) {
    // The words (runs of non-space); past maxsplit splits, the rest of the string joins the
    // word at that end (with the whitespace beyond it).
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      const size_t sp = text::space_prefix(s, i);
      if (sp > 0) {
        i += sp;
        continue;
      }
      const size_t b = i;
      while (i < s.size() && text::space_prefix(s, i) == 0) i += text::decode_at(s, i).len;
      words.emplace_back(b, i);
    }
    guard.step(words.size());
    const size_t n = words.size();
    const size_t keep = maxsplit < 0 || static_cast<size_t>(maxsplit) >= n ? n : static_cast<size_t>(maxsplit);
    if (!from_right) {
      for (size_t k = 0; k < keep; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      if (keep < n) parts.push_back(s.substr(words[keep].first));
    } else {
      if (keep < n) parts.push_back(s.substr(0, words[n - keep - 1].second));
      for (size_t k = n - keep; k < n; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    std::vector<Value> out;
    for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
    return out;
  }
  const std::string& d = sep->str();
  if (d.empty()) fail("empty separator");
  size_t from = 0, end = s.size();  // the part not split yet: s[from, end)
  while (true) {
    guard.step();
    const bool more = maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit;
    size_t at = std::string::npos;
    if (more && !from_right) at = s.find(d, from);
    if (more && from_right && end >= from + d.size()) at = s.rfind(d, end - d.size());
    if (at == std::string::npos || at < from) {
      parts.push_back(s.substr(from, end - from));
      break;
    }
    if (from_right) {
      parts.push_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
    } else {
      parts.push_back(s.substr(from, at - from));
      from = at + d.size();
    }
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

// str.format with "{}", "{0}", "{name}", "{{", "}}" and the conversions !s and !r; format specs,
// attributes and indexes inside a field are refused.
Value format(const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') fail("single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    char conv = 0;
    if (field.size() >= 2 && field[field.size() - 2] == '!') {
      conv = field.back();
      field.resize(field.size() - 2);
    }
    if (field.find_first_of(":.[") != std::string::npos || (conv != 0 && conv != 's' && conv != 'r'))
      fail("str.format fields with format specs, attributes or indexes are not supported here");
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t k = field.empty() ? auto_index++ : std::stoul(field);
      if (k >= a.args.size())
        fail("Replacement index " + std::to_string(k) + " out of range for positional args tuple");
      v = &a.args[k];
    } else {
      for (const auto& [key, x] : a.kwargs)
        if (key == field) v = &x;
      if (v == nullptr) fail("str.format: no argument named '" + field + "'");
    }
    if (conv == 'r')
      append_repr(out, *v, a.guard);
    else
      append_str(out, *v, a.guard);
    i = close;
  }
  return Value::string(std::move(out));
}

Value dict_method(const Value& self, const std::string& name, CallArgs& a) {
  Guard& g = a.guard;
  if (name == "get") {
    const Params p(a, "dict.get", {"key", "default"});
    if (p.get(0) == nullptr) fail("dict.get() takes at least 1 argument");
    const Value* v = self.dict().find(*p.get(0));
    return v != nullptr ? *v : p.get_or(1, Value::none());
  }
  Params(a, "dict." + name, {});
  std::vector<Value> out;
  for (const auto& [k, v] : self.dict().items) {
    if (name == "keys")
      out.push_back(k);
    else if (name == "values")
      out.push_back(v);
    else
      out.push_back(Value::tuple({k, v}, g));
  }
  g.step(out.size());
  return Value::list(std::move(out), g);
}

}  // namespace access_impl

}  // namespace wm::llm::jinja
