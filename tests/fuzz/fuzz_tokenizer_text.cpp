// libFuzzer target: the byte-level BPE encoder on arbitrary bytes, with the Qwen2-style test
// tokenizer (tests/llmkv/fixtures). Property: decode(encode(s, allow_special = false)) == s for
// every byte string, valid UTF-8 or not, and every id is in range.
#include <string_view>

#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

#ifndef WM_SOURCE_DIR
#error "WM_SOURCE_DIR must name the source tree (for the fixture tokenizer)"
#endif

WM_FUZZ_TARGET(tokenizer_text) {
  static const wm::llm::Tokenizer tok =
      wm::llm::Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/qwen2_style.tokenizer.json");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int64_t> ids;
  try {
    ids = tok.encode(text, /*allow_special=*/false);
  } catch (const wm::Error&) {
    return 0;  // PCRE2 giving up on a pathological input is reported, not a crash
  }
  for (int64_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  if (tok.decode(ids) != text) std::abort();
  // With special tokens matched the text still comes back whole (no added token strips here).
  if (tok.decode(tok.encode(text, /*allow_special=*/true)) != text) std::abort();
  return 0;
}
