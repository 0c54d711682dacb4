// libFuzzer target: the LLM path's tokenizer.json reader. An accepted tokenizer then encodes
// and decodes a fixed text with special tokens and invalid UTF-8 in it: whatever the file says,
// encoding must end in ids or wm::Error, and decode(encode(text, false)) must give the text back
// when every byte has a symbol and no prefix space is added (the reader's own promise).
#include "llmkv/tokenizer.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

WM_FUZZ_TARGET(tokenizer_json) {
  const std::string& path = wm::fuzz::write_input(data, size, ".tokenizer.json");
  static const std::string text =
      "<|im_start|>user\nHello, world! 12345 ' ''s  \t\n\xe4\xbd\xa0\xe5\xa5\xbd \xff\xfe caf\xc3\xa9<|im_end|>";
  try {
    wm::llm::Tokenizer t = wm::llm::Tokenizer::load(path);
    std::vector<int64_t> ids = t.encode(text, /*allow_special=*/false);
    if (!t.adds_prefix_space() && t.decode(ids) != text) std::abort();
    ids = t.encode(text, /*allow_special=*/true, /*add_special=*/true);
    (void)t.decode(ids, /*skip_special=*/true);
  } catch (const wm::Error&) {
  }
  return 0;
}
