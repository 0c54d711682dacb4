#!/usr/bin/env python3
"""Reference fixtures for the byte-level BPE tokenizer (llmkv/tokenizer.h), made with Hugging Face's
`tokenizers` library. Run by hand, not by CI:

    pip install tokenizers
    python3 tools/llm_fixtures/make_tokenizer_fixtures.py

It writes to tests/llmkv/fixtures/tokenizer/:
  corpus.txt                   a synthetic multilingual training corpus (deterministic)
  qwen2_style.tokenizer.json   vocab 1000: NFC normalizer, Split(Qwen2 pattern, Isolated) + ByteLevel,
                               specials <|endoftext|> <|im_start|> <|im_end|>, non-special <tool_call>
  gpt2_style.tokenizer.json    vocab 600: ByteLevel(use_regex=True); <|endoftext|>, <mask> (lstrip),
                               [SEP] (rstrip), zz_word (single_word, not special)
  llama3_style.tokenizer.json  vocab 600 + 2 tokens no merge makes: Split(Llama-3 pattern) + ByteLevel,
                               ignore_merges, TemplateProcessing adding <|begin_of_text|>
  cases.json                   tricky strings and, per tokenizer, the reference ids
                               ("ids": encode(text, add_special_tokens=False); "plain": the same with
                               encode_special_tokens=True; "bos": with add_special_tokens=True, when it
                               differs; "decoded": decode(ids) when it differs from the text)

cpp_trained.tokenizer.json is written by the C++ BpeTrainer (vocab 500 from corpus.txt):
    WM_UPDATE_TOKENIZER_FIXTURES=1 ./build/tests/wm_tests --gtest_filter='BpeTrainer.MatchesCommittedFixture'
When it is present, this script loads it with `tokenizers` and adds its reference ids to cases.json
under "cpp_trained", so the tests check that our trained file encodes the same in both
implementations. Order for a full refresh: this script, the C++ test with the variable set, this
script again.

The committed fixtures were made with tokenizers 0.23.3. Every text is in NFC (checked below): the
C++ tokenizer does not apply the NFC normalizer that the Qwen2-style file declares. Invalid UTF-8
cannot be a reference case (the library takes str); the C++ tests check it by round trip only.
The Qwen2-style training stops at 964 tokens, where no pair occurs twice any more (min_frequency 2).
"""
import json
import random
import sys
import unicodedata
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = Path(__file__).resolve().parents[2] / "tests" / "llmkv" / "fixtures" / "tokenizer"

QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_corpus(rng: random.Random) -> str:
    english = ("the quick brown fox jumps over lazy dog and then runs back home to rest under a tree while "
               "birds sing songs about summer rain wind light water time people world model token memory "
               "cache window layer attention value key query").split()
    contractions = ["don't", "it's", "they're", "I'll", "we've", "she'd", "I'm", "can't", "DON'T", "It'S", "you'RE"]
    foreign = ("café naïve résumé über Straße señor déjà vu Ångström Øresund Łódź façade crème brûlée "
               "Привет мир спасибо Καλημέρα κόσμε مرحبا بالعالم שלום עולם नमस्ते दुनिया").split()
    cjk = ["你好", "世界", "中文", "模型", "日本語", "テキスト", "です", "한국어", "문장", "입니다"]
    emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🚀", "🎉"]
    code = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
            "if (a != b && c >= d) { x = y; }\n", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}\n"]
    spaces = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "   "]
    parts = []
    while sum(len(p) for p in parts) < 30000:
        kind = rng.random()
        if kind < 0.55:
            words = [rng.choice(english) for _ in range(rng.randint(3, 12))]
            if rng.random() < 0.4:
                words.insert(rng.randrange(len(words)), rng.choice(contractions))
            sentence = " ".join(words)
            parts.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ",", ";", ":"]))
        elif kind < 0.65:
            parts.append(" ".join(rng.choice(foreign) for _ in range(rng.randint(2, 6))))
        elif kind < 0.72:
            parts.append("".join(rng.choice(cjk) for _ in range(rng.randint(2, 6))) + rng.choice(["。", "！", "，"]))
        elif kind < 0.77:
            parts.append(rng.choice(emoji) * rng.randint(1, 2))
        elif kind < 0.85:
            parts.append(rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 7))), f"{rng.random() * 100:.2f}",
                                     f"${rng.randint(1, 9999):,}", f"{rng.randint(1900, 2030)}"]))
        elif kind < 0.92:
            parts.append(rng.choice(code))
        elif kind < 0.96:
            parts.append("<|im_start|>user\n" + " ".join(rng.choice(english) for _ in range(5)) + "<|im_end|>\n")
        else:
            parts.append("<|endoftext|>")
        parts.append(rng.choice(spaces))
    return "".join(parts)


CASES = [
    "", "a", " ", "   ", "\t", "\n", " \n \n", "Hello world", "Hello, world! How are you doing today?",
    "  leading spaces", "trailing spaces   ", "multiple     spaces between words",
    "\t\ttabs\tand spaces \t mixed", "line1\nline2\r\nline3\n\n\nend", "ends with newline\n",
    "1234567890", "3.14159 and 2,718", "year 2024: 12 items cost $1,299.99", "phone 555-0123-4567",
    "١٢٣ Arabic-Indic digits", "Ⅻ roman numeral and ½ fraction", "007 agent 42nd 1st",
    "I'm sure you're right, it's what they've said; we'll see, he'd know.", "DON'T SHOUT, IT'S LOUD",
    "don't won't can't shouldn't", "'s 't 're 've 'm 'll 'd alone",
    "😀 smile", "👍🏽 thumbs", "family 👨‍👩‍👧‍👦 emoji", "flag 🇫🇷🇯🇵", "❤️ heart with VS16", "🚀🚀🚀",
    "你好，世界！", "日本語のテキストです。", "한국어 문장입니다.", "混合text中文mixed",
    "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "Καλημέρα κόσμε", "नमस्ते दुनिया",
    "café naïve résumé über Straße señor déjà vu", "Ångström Øresund Łódź",
    "<|endoftext|>", "text<|endoftext|>more", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|>", "partial <|im_start and <|im_end|", "nested <|<|endoftext|>|>",
    "<|endoftext|><|endoftext|>", " <|im_end|> spaced ", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "ZWJ\u200dalone", "zero\u200bwidth space", "non\u00a0breaking", "NEL\u0085char", "ideographic\u3000space",
    "em\u2003space", "mixed \u00a0 \u2003 spaces\n\t end", "URL https://example.com/path?q=1&r=2#frag",
    "email someone@example.org", "punctuation!!! ??? ... ---", "«guillemets» „quotes“ ‘single’",
    "fill the   <mask> here", "<mask>start", "zz_word alone and xzz_word attached and zz_words", "a [SEP]   b",
    " zebra", "a zebra 123 4567", "zebra123", "\u0000nul and \u0007bell and \u007fdel",
]


def random_cases(rng: random.Random, n: int):
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + list(" \t\n\r  ") +
            list(".,;:!?'\"()[]{}<>|/\\-_+=*&^%$#@~`") + list("éüßñøçàÅ") + list("你好世界日本한국") +
            list("مرحباשלוםПриветΚαλη") + ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\u00a0", "\u3000", "\u200b"] +
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|", "|>", "'s", "'LL", "<mask>", "[SEP]"])
    out = []
    while len(out) < n:
        s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 30)))
        if unicodedata.is_normalized("NFC", s):
            out.append(s)
    return out


def byte_level_trainer(vocab_size, specials):
    return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def train_qwen2_style(corpus):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus.splitlines(keepends=True), byte_level_trainer(1000, SPECIALS))
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    return tok


def train_gpt2_style(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train_from_iterator(corpus.splitlines(keepends=True), byte_level_trainer(600, ["<|endoftext|>"]))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("[SEP]", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("zz_word", single_word=True, special=False, normalized=True)])
    return tok


def train_llama3_style(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=True)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus.splitlines(keepends=True),
                            byte_level_trainer(600, ["<|begin_of_text|>", "<|end_of_text|>"]))
    # Two vocab entries that no merge produces: only ignore_merges can emit them whole.
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for extra in ["Ġzebra", "123"]:
        assert extra not in vocab
        vocab[extra] = max(vocab.values()) + 1
    j["model"]["ignore_merges"] = True
    bos = vocab["<|begin_of_text|>"]
    j["post_processor"] = json.loads(processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])]).__getstate__())
    return Tokenizer.from_str(json.dumps(j))


def references(tok, texts):
    rows = []
    for text in texts:
        row = {"ids": tok.encode(text, add_special_tokens=False).ids}
        tok.encode_special_tokens = True
        row["plain"] = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        with_special = tok.encode(text, add_special_tokens=True).ids
        if with_special != row["ids"]:
            row["bos"] = with_special
        decoded = tok.decode(row["ids"], skip_special_tokens=False)
        if decoded != text:
            row["decoded"] = decoded
        rows.append(row)
    return rows


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20240611)
    corpus = make_corpus(rng)
    assert unicodedata.is_normalized("NFC", corpus)
    (OUT / "corpus.txt").write_text(corpus, encoding="utf-8", newline="")

    texts = CASES + random_cases(rng, 40)
    for t in texts:
        assert unicodedata.is_normalized("NFC", t), repr(t)

    made = {"qwen2_style": train_qwen2_style(corpus), "gpt2_style": train_gpt2_style(corpus),
            "llama3_style": train_llama3_style(corpus)}
    results = {}
    for name, tok in made.items():
        path = OUT / f"{name}.tokenizer.json"
        path.write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
        reloaded = Tokenizer.from_file(str(path))
        results[name] = references(reloaded, texts)
        print(f"{name}: vocab {reloaded.get_vocab_size()}, {path.stat().st_size} bytes")

    cpp = OUT / "cpp_trained.tokenizer.json"
    if cpp.exists():
        results["cpp_trained"] = references(Tokenizer.from_file(str(cpp)), texts)
        print(f"cpp_trained: loaded {cpp.name} written by the C++ BpeTrainer")
    else:
        print(f"cpp_trained: {cpp.name} absent (write it with the C++ test, then run this again)", file=sys.stderr)

    lines = ['{"texts": [']
    lines.append(",\n".join(json.dumps(t, ensure_ascii=False) for t in texts))
    lines.append('],\n"results": {')
    blocks = []
    for name, rows in results.items():
        body = ",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows)
        blocks.append(f'"{name}": [\n{body}\n]')
    lines.append(",\n".join(blocks))
    lines.append("}}\n")
    (OUT / "cases.json").write_text("\n".join(lines), encoding="utf-8")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{len(texts)} cases; fixtures total {total} bytes")


if __name__ == "__main__":
    main()
