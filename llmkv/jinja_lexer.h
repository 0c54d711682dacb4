#pragma once
// The Jinja lexer of llmkv/jinja.h, with the settings transformers renders chat templates with:
// trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks (spaces
// and tabs from the start of a line up to a block or comment tag are dropped), `-` beside a tag
// strips all whitespace on that side, `+` turns lstrip / trim off for that tag, and the source's
// newlines are normalised ("\r\n" and "\r" to "\n", one final newline dropped) as Jinja does
// before lexing. Comments are dropped here; {% raw %} ... {% endraw %} comes out as data.
#include <cstdint>
#include <string>
#include <vector>

namespace wm::llm::jinja {

// A syntax error at a byte offset of the (normalised) source.
struct SyntaxFailure {
  size_t pos;
  std::string message;
};

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  size_t pos;        // byte offset in the normalised source
  std::string text;  // Data: the text; Name; String: the value, escapes decoded; Op: the operator
  int64_t int_value = 0;
  double float_value = 0;
};

// "\r\n" and "\r" as "\n", and one trailing newline dropped (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& source);

// The tokens of a normalised source, ending with Tok::End. Throws SyntaxFailure (an unclosed tag,
// comment, raw block or string, an unknown character, an unbalanced bracket, a bad escape).
std::vector<Token> tokenize(const std::string& source);

}  // namespace wm::llm::jinja
