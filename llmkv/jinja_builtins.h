#pragma once
// The built-ins of the Jinja interpreter (llmkv/jinja.h): attribute and item access as Jinja's
// sandbox does them, the methods of str and dict, the filters and tests, and the global functions
// transformers gives a chat template. Every failure is a jinja::Failure.
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llmkv/jinja_value.h"

namespace wm::llm::jinja {

// environment.getattr(obj, name): a dict's method (items, keys, values, get) or else its key, a
// namespace's attribute, a str's method; undefined for anything else (a mutating method is
// refused as the immutable sandbox refuses it, when used). Failure when obj is undefined.
Value get_attr(const Value& obj, const std::string& name, Guard& guard);
// environment.getitem(obj, key): a dict's key, a list's, tuple's or str's index (negative from the
// end); undefined when absent or out of range; a string key that is no key falls back to get_attr.
Value get_item(const Value& obj, const Value& key, Guard& guard);
// obj[start:stop:step] on a str, list or tuple (each bound undefined-free: none or an int).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, Guard& guard);

// Whether a filter / test of this name exists (the parser refuses unknown ones, as Jinja does),
// and the message for one that does not (naming Jinja's built-ins that this interpreter lacks).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
std::string missing_filter_message(const std::string& name);
std::string missing_test_message(const std::string& name);
// The filter applied to input; args holds the filter's own arguments.
Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
// The test on input; args holds the test's own arguments.
bool apply_test(const std::string& name, const Value& input, CallArgs& args);

// The global functions: range (at most 100000 items, as the sandbox), namespace, dict,
// raise_exception (fails with its message), strftime_now (local time: now, or the fixed time given).
std::vector<std::pair<std::string, Value>> global_functions(std::optional<std::time_t> fixed_now);

// A call's arguments bound to a Python signature: at most names.size() positional ones, keyword
// ones by these names only, none given twice (Failure otherwise, naming the function).
class Params {
 public:
  Params(const CallArgs& args, std::string function, std::vector<const char*> names);
  // The argument for parameter i, by position or by keyword; nullptr when not given.
  const Value* get(size_t i) const { return bound_[i]; }
  Value get_or(size_t i, Value dflt) const { return bound_[i] != nullptr ? *bound_[i] : std::move(dflt); }
  // Parameter i as an int / a bool (truthiness) / a string, or the default when not given.
  int64_t int_or(size_t i, int64_t dflt) const;
  bool bool_or(size_t i, bool dflt) const;
  std::string string_or(size_t i, std::string dflt, Guard& guard) const;
  const std::string& function() const { return function_; }

 private:
  std::string function_;
  std::vector<const char*> names_;
  std::vector<const Value*> bound_;
};

// The message raise_exception fails with starts with this.
inline constexpr const char* kRaisedPrefix = "the template raised an exception: ";

}  // namespace wm::llm::jinja
