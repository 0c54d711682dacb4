#pragma once
// The prompt cleaning of umT5's tokenizer as LingBot-World-Fast runs it: upstream's
// HuggingfaceTokenizer(clean='whitespace') applies whitespace_clean(basic_clean(text)) before
// tokenizing (Robbyant/lingbot-world 91ff5f6, wan/modules/tokenizers.py), where basic_clean is
// ftfy.fix_text, then Python's html.unescape twice, then strip, and whitespace_clean collapses
// every run of Unicode white space to one space and strips again.
//
// What of ftfy.fix_text (6.x, default config) is reproduced, per line as ftfy segments the text
// and repeated to a fixed point as it does: HTML entities ending in ';' (html5's names and ftfy's
// all-caps ones, only while no '<' has been seen: ftfy's "auto"), C1 controls read as
// Windows-1252, Latin ligatures, full-width ASCII and the ideographic space, curly quotes, ANSI
// terminal escapes, control characters. Not reproduced: mojibake repair (fix_encoding and its
// helpers), NFC normalisation, half-width forms other than ASCII. NFC and the half-width forms are
// what SentencePiece's nmt_nfkc normaliser (T5's) does again to the text, so the token ids are the
// same; mojibake is not repaired (see dit/README.md, umT5).
//
// html.unescape is Python's (3.x): numeric references with its replacements (Windows-1252 for
// 0x80-0x9F, U+FFFD for 0, surrogates and values past U+10FFFF, nothing for the code points
// HTML forbids), the 2231 names of html.entities.html5 (the legacy ones also without ';', longest
// prefix first).
#include <string>

namespace wm::dit {

// Upstream's whitespace_clean(basic_clean(text)) on UTF-8 text (with the limits above). Throws
// wm::Error naming the byte offset when `utf8` is not valid UTF-8.
std::string umt5_clean_whitespace(const std::string& utf8);

// Python's html.unescape(s) on UTF-8 text. Throws wm::Error on invalid UTF-8.
std::string python_html_unescape(const std::string& utf8);

}  // namespace wm::dit
