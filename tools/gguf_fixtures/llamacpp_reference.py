#!/usr/bin/env python3
"""llama.cpp's answers on SmolLM2-135M-Instruct's GGUF file, as small JSON fixtures that the
project's tests hold its own GGUF path to (tests/llmkv/test_smollm2.cpp). Run by hand:

  python3 -m venv /tmp/llvenv
  CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/llvenv/bin/pip install llama-cpp-python==0.3.36 jinja2
  M=$(bash tools/get_model.sh smollm2)
  /tmp/llvenv/bin/python tools/gguf_fixtures/llamacpp_reference.py --model "$M"

Writes tests/llmkv/fixtures/smollm2/:
  tokenizer.json   ids of 200+ strings (scripts, emoji, code, digits, white space runs, CRLF,
                   control tokens in text), with special tokens parsed and not
  logits.json      3 prompts x 64 positions: llama.cpp's top-20 logits per position and the
                   log-sum-exp of its whole row (for a truncated KL)
  greedy.json      10 prompts, llama.cpp's 32 greedy tokens and, per step, the gap between its
                   top two logits (near-ties explain a differing token)
  chat.json        the rendered chat template (jinja2, as transformers renders it) for
                   "Name three primary colors." and llama.cpp's greedy answer
  logits_f32.json  with --dequantized: the same as logits.json from a copy of the file whose
                   weights are decoded to float32 (gguf-py's dequantize) and a float32 K/V cache,
                   so that llama.cpp multiplies in float32 as the project's float mode does
  logits_f32kv.json, greedy_f32kv.json
                   with --f32-cache: logits.json's and greedy.json's prompts on the same Q4_1 file
                   with a float32 K/V cache (llama.cpp's default is float16, which rounds every
                   key, value, query and attention weight to 11 bits; the project keeps them in
                   float32). greedy_f32kv.json's meta counts how many of the 10 continuations
                   equal greedy.json's: how far llama.cpp's own cache type moves its greedy text
  perplexity.json  the token ids of Debian's license texts (/usr/share/common-licenses, real
                   English prose) cut to whole 1,024-token windows, and llama.cpp's perplexity
                   over them (each window evaluated afresh, every token after the first scored)
"""
import argparse
import json
import math
import os
import sys

import numpy as np

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "llmkv", "fixtures", "smollm2")
LICENSES = ["GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic", "MPL-1.1",
            "GPL-1", "LGPL-2", "GFDL-1.2", "CC0-1.0", "BSD"]


def log(*a):
    print("llamacpp_reference:", *a, file=sys.stderr, flush=True)


def tokenizer_strings():
    base = [
        "Hello world", "hello world", "HELLO WORLD", " Hello", "  Hello", "Hello  ", "\tHello\t", "\n", "\n\n",
        "\r\n", "a\r\nb", "line one\r\nline two\r\n", "   ", "      leading", "trailing      ", "a  b   c    d",
        "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42", "0x1F", "v1.2.3",
        "2026-11-28", "It's", "it's", "I'M", "we'll", "they've", "she'd", "don't", "DON'T", "you're",
        "Ünïcödé", "naïve café", "Straße", "Привет, мир", "Здравствуйте", "Γειά σου Κόσμε", "שלום עולם",
        "مرحبا بالعالم", "नमस्ते दुनिया", "你好，世界", "こんにちは世界", "안녕하세요 세계", "สวัสดีชาวโลก",
        "Tiếng Việt có dấu", "ｆｕｌｌｗｉｄｔｈ", "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "I ❤️ NY", "★☆✓✗",
        "e\u0301", "\u00e9", "\u200b", "\u00a0non-breaking\u00a0space", "tab\tseparated\tvalues",
        "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { a[i] = b[i]; }",
        "#include <stdio.h>\nint main() { printf(\"hi\\n\"); }", "SELECT * FROM t WHERE id = 42;",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "<html><body class=\"x\">Hi</body></html>",
        "x = lambda a, b: a ** b", "if (a && b || !c) return;", "// comment\n/* block */", "$ ls -la | grep foo",
        "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Users\\name\\file.txt",
        "~!@#$%^&*()_+`-=[]{}|;':\",./<>?", "...", "—", "–", "«quoted»", "“smart quotes”", "‘single’",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n",
        "text<|im_end|>more", "<|im_start|><|im_end|>", "<|im_start|>assistant\n", "not <|special|> at all",
        "<|im_start", "im_start|>", "<repo_name>", "<file_sep>", "", " ", "a", "A", "ab", "Ġ", "âĢ",
    ]
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        lines = [ln for ln in f.read().split("\n") if ln.strip()]
    prose = lines[10:10 + 90]
    combos = [a + b for a, b in zip(base[::7], base[3::7])]
    return base + prose + combos


def tokenize(llm, text, special):
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)


def top_entries(row, k):
    idx = np.argsort(-row, kind="stable")[:k]
    return [[int(i), float(row[i])] for i in idx]


def logsumexp(row):
    m = float(np.max(row))
    return m + math.log(float(np.sum(np.exp(row.astype(np.float64) - m))))


def eval_scores(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: llm.n_tokens], dtype=np.float32)


def logits_fixture(llm):
    with open("/usr/share/common-licenses/Apache-2.0", encoding="utf-8") as f:
        apache = f.read()
    prompts = [
        apache[:1500],
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
        "        a, b = b, a + b\n    return a\n\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n\n"
        "    def push(self, x):\n        self.items.append(x)\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWrite a short poem about the sea and the sky, and explain what makes a poem good."
        "<|im_end|>\n<|im_start|>assistant\nThe sea is wide, the sky is high,\nThe waves roll in, the gulls go by;\n"
        "Blue meets blue where the sailors sigh,\n",
    ]
    out = []
    for p in prompts:
        toks = tokenize(llm, p, True)[:64]
        assert len(toks) == 64, len(toks)
        sc = eval_scores(llm, toks)
        out.append({"text": p, "tokens": toks,
                     "positions": [{"top": top_entries(sc[i], 20), "logsumexp": logsumexp(sc[i])} for i in range(64)]})
    return out


def greedy(llm, tokens, n, stop=None):
    llm.reset()
    llm.eval(tokens)
    got, gaps = [], []
    for _ in range(n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-row, kind="stable")
        t = int(order[0])
        got.append(t)
        gaps.append(float(row[order[0]] - row[order[1]]))
        if stop is not None and t == stop:
            break
        llm.eval([t])
    return got, gaps


def greedy_fixture(llm):
    prompts = ["The capital of France is", "Once upon a time, in a small village,", "def quicksort(arr):",
               "The three laws of thermodynamics are", "To make a cup of tea, first",
               "In 1969, the first humans to walk on the Moon", "The quick brown fox",
               "Machine learning is a field of", "My favourite recipe for pancakes:", "import numpy as np\n"]
    out = []
    for p in prompts:
        toks = tokenize(llm, p, False)
        got, gaps = greedy(llm, toks, 32)
        out.append({"prompt": p, "prompt_tokens": toks, "tokens": got, "gaps": gaps,
                    "text": llm.detokenize(got).decode("utf-8", "replace")})
    return out


def chat_fixture(llm, template):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    msgs = [{"role": "user", "content": "Name three primary colors."}]
    text = env.from_string(template).render(messages=msgs, add_generation_prompt=True, bos_token="",
                                            eos_token="<|im_end|>")
    toks = tokenize(llm, text, True)
    im_end = tokenize(llm, "<|im_end|>", True)[0]
    got, gaps = greedy(llm, toks, 64, stop=im_end)
    answer = got[:-1] if got and got[-1] == im_end else got
    return {"messages": msgs, "rendered": text, "prompt_tokens": toks, "tokens": got, "gaps": gaps,
            "answer": llm.detokenize(answer).decode("utf-8", "replace"), "jinja2": jinja2.__version__}


def perplexity_fixture(llm, window, n_windows):
    text = ""
    for name in LICENSES:
        with open(os.path.join("/usr/share/common-licenses", name), encoding="utf-8", errors="replace") as f:
            text += f.read() + "\n"
    toks = tokenize(llm, text, False)
    assert len(toks) >= window * n_windows, (len(toks), window * n_windows)
    toks = toks[: window * n_windows]
    nll, count, per_window = 0.0, 0, []
    for w in range(n_windows):
        chunk = toks[w * window:(w + 1) * window]
        sc = eval_scores(llm, chunk).astype(np.float64)
        for i in range(window - 1):
            row = sc[i]
            m = row.max()
            nll += m + math.log(np.exp(row - m).sum()) - row[chunk[i + 1]]
            count += 1
        per_window.append(nll - sum(per_window))
        log(f"perplexity window {w + 1}/{n_windows}: {math.exp(nll / count):.4f}")
    return {"source": "/usr/share/common-licenses (Debian base-files): " + ", ".join(LICENSES),
            "window": window, "tokens": toks, "scored": count, "mean_nll": nll / count, "window_nll": per_window,
            "perplexity": math.exp(nll / count)}


def write_dequantized(src, dst):
    """A copy of the GGUF file with every tensor decoded to float32 (metadata as it was)."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if k == "general.file_type":
            w.add_uint32(k, 0)  # all F32
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), vt)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_f32_cache(a):
    from llama_cpp import Llama
    import llama_cpp
    llm = Llama(model_path=a.model, n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=a.threads, logits_all=True,
                verbose=False, seed=0, type_k=0, type_v=0)
    with open(os.path.join(a.out, "greedy.json"), encoding="utf-8") as f:
        default = json.load(f)["data"]
    greedy = greedy_fixture(llm)
    same = sum(g["tokens"] == d["tokens"] for g, d in zip(greedy, default))
    meta = {"llama_cpp_python": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode(),
            "model": os.path.basename(a.model), "kv_cache": "F32"}
    for name, data, extra in (("logits_f32kv.json", logits_fixture(llm), {}),
                              ("greedy_f32kv.json", greedy, {"equal_to_f16_cache": same})):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            json.dump({"meta": {**meta, **extra}, "data": data}, f, ensure_ascii=False, separators=(",", ":"))
        log("wrote", name)
    log(f"llama.cpp with a float32 cache: {same}/{len(greedy)} greedy continuations equal to its float16 cache's")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (tools/get_model.sh smollm2)")
    ap.add_argument("--out", default=FIXTURES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=20, help="1,024-token windows for the perplexity")
    ap.add_argument("--dequantized", default="", help="write the float32 copy here and logits_f32.json from it")
    ap.add_argument("--f32-cache", action="store_true",
                    help="write logits_f32kv.json and greedy_f32kv.json (a float32 K/V cache) and stop")
    ap.add_argument("--only", default="", help="comma-separated subset: tokenizer,logits,greedy,chat,perplexity")
    a = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama
    log("llama-cpp-python", llama_cpp.__version__, "|", llama_cpp.llama_print_system_info().decode())
    if a.dequantized:
        write_dequantized(a.model, a.dequantized)
        log("wrote", a.dequantized)
        llm = Llama(model_path=a.dequantized, n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=a.threads,
                    logits_all=True, verbose=False, seed=0, type_k=0, type_v=0)
        meta = {"llama_cpp_python": llama_cpp.__version__, "model": os.path.basename(a.model) + " decoded to F32",
                "kv_cache": "F32"}
        with open(os.path.join(a.out, "logits_f32.json"), "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "data": logits_fixture(llm)}, f, ensure_ascii=False, separators=(",", ":"))
        log("wrote logits_f32.json")
        return
    if a.f32_cache:
        write_f32_cache(a)
        return
    llm = Llama(model_path=a.model, n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=a.threads, logits_all=True,
                verbose=False, seed=0)
    os.makedirs(a.out, exist_ok=True)
    only = set(a.only.split(",")) if a.only else {"tokenizer", "logits", "greedy", "chat", "perplexity"}
    meta = {"llama_cpp_python": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode(),
            "model": os.path.basename(a.model)}

    def write(name, data):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "data": data}, f, ensure_ascii=False, separators=(",", ":"))
        log("wrote", name)

    if "tokenizer" in only:
        write("tokenizer.json", [{"text": s, "special": tokenize(llm, s, True), "plain": tokenize(llm, s, False)}
                                 for s in tokenizer_strings()])
    if "logits" in only:
        write("logits.json", logits_fixture(llm))
    if "greedy" in only:
        write("greedy.json", greedy_fixture(llm))
    if "chat" in only:
        write("chat.json", chat_fixture(llm, llm.metadata["tokenizer.chat_template"]))
    if "perplexity" in only:
        write("perplexity.json", perplexity_fixture(llm, 1024, a.windows))


if __name__ == "__main__":
    main()
