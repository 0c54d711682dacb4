#!/usr/bin/env python3
"""This project's LLM decode and prefill against llama.cpp's and transformers', side by side.

Run by hand (not by the tests): it needs PyPI. By default it makes a virtual environment of its
own (--venv) with llama-cpp-python, gguf, transformers, torch and safetensors, and re-runs itself
there; --python names an interpreter that already has them.

For each shape (--shapes: qwen2-0.5b, llama-1b) it
  1. makes a model of that shape with random weights through transformers (bfloat16 safetensors)
     and this project's tiny tokenizer (token ids are what is fed; the text side plays no part),
  2. converts it to GGUF (f32, bf16, q8_0) with llama.cpp's own convert_hf_to_gguf.py, from the
     llama-cpp-python source distribution (its BPE pre-tokenizer check is told "qwen2" or
     "llama-bpe": the tokenizer is not one it knows, and no text is tokenized here),
  3. times prefill of --contexts random token ids and --decode greedy steps after each, on
     --threads threads, in rounds (--rounds, the engines alternating inside each round, every
     run a process of its own): wm_bench_llm (float32, bfloat16, int8 weights with bfloat16
     activations), llama.cpp (f32, bf16, q8_0; its default f16 K/V), transformers (float32,
     bfloat16),
and prints each figure's median over the rounds and the ratios to llama.cpp (Markdown; --json
for the raw figures).

With --gguf FILE (a real model, e.g. SmolLM2-135M-Instruct's Q4_1 file from tools/get_model.sh)
the same file runs in both: ours with its quantized blocks as stored (--weights stored, 8-bit
activations), llama.cpp as it loads it; prefill and decode at --contexts (default 512 4096), then
--streams sequences of --stream-context tokens decoded together (ours: wm_bench_llm --streams,
the step wm_serve's continuous batching runs; llama.cpp: one llama_batch holding a token of each
sequence per step, as its server batches), and each engine process's peak resident set. Both
keep K/V in float16 (llama.cpp's default; ours --kv-dtype float16, attention accumulating in
float32).

llama.cpp should be built for this CPU, as a user would install it:
  CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36
(--python names that interpreter); the script prints llama_print_system_info() beside the figures.

  python3 tools/bench_llm/vs_llamacpp.py --bench build/tools/bench_llm/wm_bench_llm
  python3 tools/bench_llm/vs_llamacpp.py --python /tmp/llvenv/bin/python --gguf "$(bash tools/get_model.sh smollm2)"
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
PACKAGES = [f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "gguf", "transformers", "torch", "safetensors", "numpy"]
ROOT = Path(__file__).resolve().parents[2]

SHAPES = {
    "qwen2-0.5b": dict(arch="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768),
    # Llama-3.2-1B's sizes (without its long-context RoPE scaling).
    "llama-1b": dict(arch="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                     tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
                     max_position_embeddings=131072),
}

# (engine, precision) pairs in the order each round runs them; llama.cpp's q8_0 sits beside our int8.
# "q8_0-stored": ours on llama.cpp's own q8_0 file, its blocks as stored (8-bit activations).
RUNS = [("ours", "float32"), ("llama.cpp", "f32"), ("transformers", "float32"),
        ("ours", "bfloat16"), ("llama.cpp", "bf16"), ("transformers", "bfloat16"),
        ("ours", "int8"), ("ours", "q8_0-stored"), ("llama.cpp", "q8_0")]
PAIRS = [("float32", "f32"), ("bfloat16", "bf16"), ("int8", "q8_0"), ("q8_0-stored", "q8_0")]


def log(*a):
    print("vs_llamacpp:", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- environment

def ensure_env(args):
    """Re-runs this script under an interpreter that has the packages (made if need be)."""
    if os.environ.get("WM_VS_LLAMACPP_CHILD") == "1":
        return
    py = args.python
    if py is None:
        venv = Path(args.venv)
        py = str(venv / "bin" / "python")
        if not Path(py).exists():
            log(f"making a virtual environment at {venv}")
            subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
        try:
            subprocess.check_call([py, "-c", "import llama_cpp, gguf, transformers, torch, safetensors"],
                                  stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            log("installing", " ".join(PACKAGES), "(llama-cpp-python builds llama.cpp: minutes)")
            # llama.cpp built for this CPU but without AMX: its AMX int8 path faults (SIGSEGV) on
            # multi-token q8_0 batches on this project's VMs. CMAKE_ARGS set by the caller wins.
            no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            env = dict(os.environ)
            env.setdefault("CMAKE_ARGS", f"-DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'")
            subprocess.check_call([py, "-m", "pip", "install", "-q", "--no-cache-dir", *PACKAGES], env=env)
    env = dict(os.environ, WM_VS_LLAMACPP_CHILD="1")
    os.execve(py, [py, __file__, *sys.argv[1:]], env)


def converter_dir(work: Path) -> Path:
    """llama.cpp's converter (and the gguf-py it goes with) from llama-cpp-python's sdist."""
    top = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if (top / "convert_hf_to_gguf.py").exists():
        return top
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                           f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)])
    with tarfile.open(work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as tf:
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        members = [m for m in tf.getmembers()
                   if m.name.startswith(prefix + "convert_hf_to_gguf.py") or m.name.startswith(prefix + "conversion/")
                   or m.name.startswith(prefix + "gguf-py/")]
        tf.extractall(work, members=members)
    return top


# ---------------------------------------------------------------- model files

def make_model(shape: str, out: Path, seed: int):
    import torch
    import transformers
    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    cls = transformers.Qwen2Config if arch == "qwen2" else transformers.LlamaConfig
    cfg = cls(**spec, torch_dtype="bfloat16", bos_token_id=None, eos_token_id=0)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok = ROOT / "assets" / "models" / "tiny-llm" / "tokenizer.json"
    (out / "tokenizer.json").write_bytes(tok.read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "model_max_length": 1 << 20}))


def convert(model_dir: Path, outtype: str, out: Path, conv: Path, arch: str):
    sys.path.insert(0, str(conv / "gguf-py"))
    sys.path.insert(0, str(conv))
    import runpy
    import conversion.base as base
    pre = "qwen2" if arch == "qwen2" else "llama-bpe"
    for name in dir(base):
        cls = getattr(base, name)
        if isinstance(cls, type) and "get_vocab_base_pre" in cls.__dict__:
            cls.get_vocab_base_pre = lambda self, tokenizer, pre=pre: pre
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    runpy.run_path(str(conv / "convert_hf_to_gguf.py"), run_name="__main__")


# ---------------------------------------------------------------- engines (each a process)

def run_measured(cmd, env=None):
    """Runs cmd; returns (stdout, the process's peak resident set in MiB)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)  # exec resets the child's peak
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd)
    return out, usage.ru_maxrss / 1024.0

def prompt_ids(vocab: int, n: int, seed: int):
    import numpy as np
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def run_llama(gguf: Path, contexts, decode: int, threads: int, vocab: int, seed: int):
    import numpy as np
    from llama_cpp import Llama
    rows = []
    llm = Llama(model_path=str(gguf), n_ctx=max(contexts) + decode + 16, n_threads=threads,
                n_threads_batch=threads, n_batch=512, n_ubatch=512, verbose=False)
    vocab = vocab or llm.n_vocab()
    for ctx in contexts:
        ids = prompt_ids(vocab, ctx, seed + ctx)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(decode):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
            llm.eval([int(logits.argmax())])
        dec = time.perf_counter() - t0
        rows.append({"context": ctx, "prefill_tps": ctx / prefill, "decode_tps": decode / dec})
    return rows


def run_llama_streams(gguf: Path, streams, context: int, decode: int, threads: int, seed: int):
    """Aggregate decode tokens/s of n sequences decoded together: each step one llama_batch holding
    the next token of every sequence (each its own seq_id), as llama.cpp's server batches slots."""
    import ctypes
    import numpy as np
    import llama_cpp as L
    rows = []
    model = L.llama_model_load_from_file(str(gguf).encode(), L.llama_model_default_params())
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    for n in streams:
        cp = L.llama_context_default_params()
        cp.n_ctx = ((n * (context + decode + 16) + 255) // 256) * 256
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = n
        cp.n_threads = cp.n_threads_batch = threads
        ctx = L.llama_init_from_model(model, cp)
        batch = L.llama_batch_init(512, 0, n)

        def decode_batch(entries):  # entries: (token, pos, seq, wants logits)
            batch.n_tokens = len(entries)
            for i, (t, p, sq, lg) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, int(lg)
                batch.seq_id[i][0] = sq
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

        last = []
        for sq in range(n):
            ids = prompt_ids(vocab, context, seed + 7919 * sq)
            for c0 in range(0, context, 512):
                chunk = ids[c0:c0 + 512]
                decode_batch([(t, c0 + i, sq, c0 + i == context - 1) for i, t in enumerate(chunk)])
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, len(chunk) - 1), shape=(vocab,))
            last.append(int(logits.argmax()))
        t0 = time.perf_counter()
        for step in range(decode):
            decode_batch([(last[sq], context + step, sq, True) for sq in range(n)])
            for sq in range(n):
                last[sq] = int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, sq), shape=(vocab,)).argmax())
        dt = time.perf_counter() - t0
        rows.append({"streams": n, "aggregate_tps": n * decode / dt})
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)
    return rows


def run_transformers(model_dir: Path, dtype: str, contexts, decode: int, threads: int, vocab: int, seed: int):
    import torch
    import transformers
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype))
    model.eval()
    rows = []
    with torch.inference_mode():
        for ctx in contexts:
            ids = torch.tensor([prompt_ids(vocab, ctx, seed + ctx)])
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            prefill = time.perf_counter() - t0
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            for _ in range(decode):
                out = model(tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            dec = time.perf_counter() - t0
            rows.append({"context": ctx, "prefill_tps": ctx / prefill, "decode_tps": decode / dec})
    return rows


def run_ours(bench: str, model_dir: Path, precision: str, contexts, decode: int, threads: int, work: Path,
             streams=(), stream_context=256):
    js = work / "ours.json"
    cmd = [bench, "-m", str(model_dir), "--contexts", *map(str, contexts), "--decode-tokens", str(decode),
           "--bank-block", "0", "--threads", str(threads), "--json", str(js)]
    if precision == "stored":
        # A GGUF file's blocks as stored, activations rounded to 8 bits, K/V in float16: what
        # llama.cpp does with the same file by default.
        cmd += ["--weights", "stored", "--quant-activations", "q8", "--kv-dtype", "float16"]
    elif precision == "int8":
        # int8 weights with bfloat16 activations and K/V: decode reads the int8 weights, prefill
        # dequantises them to bfloat16 for the GEMM (float32 activations make prefill 1.2-1.7x slower).
        cmd += ["--dtype", "bfloat16", "--weights", "int8"]
    else:
        cmd += ["--dtype", precision]
    if streams:
        cmd += ["--streams", *map(str, streams), "--stream-context", str(stream_context), "--stream-reps", "1"]
    _, rss = run_measured(cmd)
    data = json.loads(js.read_text())
    rows = [{"context": r["context"], "prefill_tps": r["prefill_tokens_per_s"], "decode_tps": r["decode_tokens_per_s"]}
            for r in data["rows"]]
    for r in data.get("streams", []):
        rows.append({"streams": r["streams"], "aggregate_tps": r["aggregate_tokens_per_s"]})
    return rows, rss


def vm_hwm_mib() -> float:
    """This process's peak resident set so far (VmHWM), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def worker(args):
    contexts = [int(c) for c in args.contexts]
    vocab = SHAPES[args.shape]["vocab_size"] if args.shape in SHAPES else None  # None: the file's, once loaded
    if args.worker == "make":
        make_model(args.shape, Path(args.model_dir), args.seed)
    elif args.worker == "convert":
        convert(Path(args.model_dir), args.precision, Path(args.gguf), Path(args.conv), SHAPES[args.shape]["arch"])
    elif args.worker == "llama.cpp":
        import llama_cpp
        base = vm_hwm_mib()
        rows = run_llama(Path(args.gguf), contexts, args.decode, args.threads, vocab, args.seed)
        if args.streams:
            rows += run_llama_streams(Path(args.gguf), args.streams, args.stream_context, args.decode, args.threads,
                                      args.seed)
        rows.append({"interpreter_rss_mib": base, "peak_rss_mib": vm_hwm_mib(),
                     "system_info": llama_cpp.llama_print_system_info().decode()})
        print(json.dumps(rows))
    elif args.worker == "transformers":
        print(json.dumps(run_transformers(Path(args.model_dir), args.precision, contexts, args.decode, args.threads,
                                          vocab, args.seed)))


# ---------------------------------------------------------------- driver

def sub(args, kind, **kw):
    cmd = [sys.executable, __file__, "--worker", kind, "--shape", kw["shape"], "--seed", str(args.seed),
           "--threads", str(args.threads), "--decode", str(args.decode), "--contexts", *map(str, args.contexts)]
    for k in ("model_dir", "gguf", "precision", "conv"):
        if k in kw:
            cmd += ["--worker-gguf" if k == "gguf" else f"--{k.replace('_', '-')}", str(kw[k])]
    if kw.get("streams"):
        cmd += ["--streams", *map(str, kw["streams"]), "--stream-context", str(args.stream_context)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1]) if kind in ("llama.cpp", "transformers") else None


def table(shape, figures, contexts, loads=None):
    """Medians of each run's figures and their ratios; then the median of each round's own ratio
    (the two engines ran one after the other: on a shared machine this follows the load less)
    and the 1-minute load average before each run."""
    med = {k: {c: {m: statistics.median(r[c][m] for r in v) for m in ("prefill_tps", "decode_tps")}
               for c in contexts} for k, v in figures.items()}
    lines = [f"\n### {shape}: medians of {len(next(iter(figures.values())))} rounds (tokens/s)\n"]
    head = "| engine | " + " | ".join(f"prefill {c} | decode @{c}" for c in contexts) + " |"
    lines += [head, "|---" * (1 + 2 * len(contexts)) + "|"]
    for (eng, prec) in RUNS:
        k = f"{eng} {prec}"
        if k in med:
            lines.append(f"| {k} | " + " | ".join(f"{med[k][c]['prefill_tps']:.1f} | {med[k][c]['decode_tps']:.2f}"
                                                  for c in contexts) + " |")
    cols = " | ".join(f"prefill {c} | decode @{c}" for c in contexts)
    rule = "|---" * (1 + 2 * len(contexts)) + "|"
    lines += ["", f"| ours / llama.cpp | {cols} |", rule]
    per_round = ["", f"| median of the rounds' ratios | {cols} |", rule]
    for ours, theirs in PAIRS:
        a, b = med.get(f"ours {ours}"), med.get(f"llama.cpp {theirs}")
        if a and b:
            lines.append(f"| {ours} / {theirs} | " + " | ".join(
                f"{a[c]['prefill_tps'] / b[c]['prefill_tps']:.2f}x | {a[c]['decode_tps'] / b[c]['decode_tps']:.2f}x"
                for c in contexts) + " |")
            ra, rb = figures[f"ours {ours}"], figures[f"llama.cpp {theirs}"]
            ratio = {c: {m: statistics.median(x[c][m] / y[c][m] for x, y in zip(ra, rb))
                         for m in ("prefill_tps", "decode_tps")} for c in contexts}
            per_round.append(f"| {ours} / {theirs} | " + " | ".join(
                f"{ratio[c]['prefill_tps']:.2f}x | {ratio[c]['decode_tps']:.2f}x" for c in contexts) + " |")
    lines += per_round
    if loads:
        lines += ["", "1-minute load average before each run (rounds in order): " + "; ".join(
            f"{k} {', '.join(f'{v:.1f}' for v in vs)}" for k, vs in loads.items())]
    return "\n".join(lines), med


def gguf_bench(args):
    """--gguf: the same real file in both engines, alternating in each round."""
    gguf_path = Path(args.gguf_file).resolve()
    name = gguf_path.stem
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    figures, rss, info, base = {"ours stored": [], "llama.cpp": []}, {"ours stored": [], "llama.cpp": []}, "", []
    loads = {"ours stored": [], "llama.cpp": []}
    for rnd in range(args.rounds):
        for eng in ("ours stored", "llama.cpp"):
            loads[eng].append(os.getloadavg()[0])
            log(f"{name}: round {rnd + 1}/{args.rounds}: {eng} (load {loads[eng][-1]:.1f})")
            if eng == "ours stored":
                rows, r = run_ours(args.bench, gguf_path, "stored", args.contexts, args.decode, args.threads, work,
                                   args.streams, args.stream_context)
            else:
                rows = sub(args, "llama.cpp", shape=name, gguf=gguf_path, streams=args.streams)
                meta = rows.pop()
                info, base, r = meta["system_info"], base + [meta["interpreter_rss_mib"]], meta["peak_rss_mib"]
            figures[eng].append(rows)
            rss[eng].append(r)
    med = {}
    for eng, rounds in figures.items():
        m = {}
        for c in args.contexts:
            for k in ("prefill_tps", "decode_tps"):
                m[(c, k)] = statistics.median(next(x[k] for x in rr if x.get("context") == c) for rr in rounds)
        for n in args.streams:
            m[("streams", n)] = statistics.median(next(x["aggregate_tps"] for x in rr if x.get("streams") == n)
                                                  for rr in rounds)
        med[eng] = m
    cols = [(c, k) for c in args.contexts for k in ("prefill_tps", "decode_tps")] + [("streams", n) for n in args.streams]
    label = {"prefill_tps": "prefill @{}", "decode_tps": "decode @{}"}
    heads = [label[k].format(c) if c != "streams" else f"{k} streams" for c, k in cols]
    lines = [f"\n### {name}: medians of {args.rounds} rounds, tokens/s (streams: aggregate decode tokens/s, "
             f"{args.stream_context}-token prompts)\n",
             "| engine | " + " | ".join(heads) + " | peak RSS MiB |", "|---" * (len(cols) + 2) + "|"]
    for eng in med:
        lines.append(f"| {eng} | " + " | ".join(f"{med[eng][c]:.1f}" for c in cols) +
                     f" | {statistics.median(rss[eng]):.0f} |")
    lines.append("| ours / llama.cpp | " + " | ".join(f"{med['ours stored'][c] / med['llama.cpp'][c]:.2f}x"
                                                     for c in cols) + " | |")

    def value(rr, c):
        return next(x[c[1]] for x in rr if x.get("context") == c[0]) if c[0] != "streams" else \
            next(x["aggregate_tps"] for x in rr if x.get("streams") == c[1])
    lines.append("| median of the rounds' ratios | " + " | ".join(
        f"{statistics.median(value(a, c) / value(b, c) for a, b in zip(figures['ours stored'], figures['llama.cpp'])):.2f}x"
        for c in cols) + " | |")
    lines.append("\n1-minute load average before each run (rounds in order): " + "; ".join(
        f"{k} {', '.join(f'{v:.1f}' for v in vs)}" for k, vs in loads.items()))
    lines.append(f"\nllama.cpp: llama-cpp-python {LLAMA_CPP_PYTHON}, its default f16 K/V; system info: {info.strip()}")
    lines.append(f"llama.cpp's RSS includes its Python interpreter and numpy: {statistics.median(base):.0f} MiB "
                 f"before the model loads. Ours: weights as stored, 8-bit activations, K/V in float16 as llama.cpp's.")
    lines.append(f"{args.threads} threads, {args.decode} greedy steps after each prefill, OMP_WAIT_POLICY "
                 f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": figures, "rss_mib": rss, "load_before": loads}, indent=1,
                                              default=str))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=str(ROOT / "build" / "tools" / "bench_llm" / "wm_bench_llm"),
                    help="this project's wm_bench_llm")
    ap.add_argument("--shapes", nargs="+", default=["qwen2-0.5b", "llama-1b"], choices=sorted(SHAPES))
    ap.add_argument("--contexts", nargs="+", type=int, help="prompt lengths (default 1024 4096; 512 4096 with --gguf)")
    ap.add_argument("--gguf", dest="gguf_file", help="a real GGUF file, run as stored in both engines (see above)")
    ap.add_argument("--streams", nargs="*", type=int, default=[], help="with --gguf: sequences decoded together (e.g. 4 8)")
    ap.add_argument("--stream-context", type=int, default=256, help="each stream's prompt in tokens")
    ap.add_argument("--decode", type=int, default=64, help="greedy steps after each prefill")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", nargs="+", default=["ours", "llama.cpp", "transformers"])
    ap.add_argument("--runs", nargs="+", metavar="ENGINE:PRECISION",
                    help="only these of the runs (e.g. ours:int8 llama.cpp:q8_0); default: all of --engines'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait-policy", default="passive", choices=["passive", "active", "unset"],
                    help="OMP_WAIT_POLICY for every engine (llama.cpp's wheel and libtorch both use OpenMP)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "worldmem" / "vs-llamacpp"),
                    help="models, GGUF files and the converter (kept between runs)")
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "worldmem" / "vs-llamacpp-venv"))
    ap.add_argument("--python", help="an interpreter that has the packages (no virtual environment made)")
    ap.add_argument("--json", help="also write every round's figures here")
    # Internal: one engine run, in a process of its own.
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--worker-gguf", dest="gguf", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("--conv", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.contexts is None:
        args.contexts = [512, 4096] if args.gguf_file and not args.worker else [1024, 4096]
    if args.worker:
        return worker(args)
    if "ours" in args.engines and not Path(args.bench).is_file():
        sys.exit(f"vs_llamacpp: no wm_bench_llm at {args.bench} (build it, or --bench PATH)")
    ensure_env(args)
    if args.wait_policy == "unset":
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = args.wait_policy
    if args.gguf_file:
        return gguf_bench(args)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report, raw = [], {}
    for shape in args.shapes:
        mdir = work / shape
        if not (mdir / "model.safetensors").exists() and not (mdir / "model.safetensors.index.json").exists():
            log(f"{shape}: making the random-weight model")
            mdir.mkdir(parents=True, exist_ok=True)
            sub(args, "make", shape=shape, model_dir=mdir)
        ggufs = {}
        if "llama.cpp" in args.engines:
            conv = converter_dir(work)
            for prec in ("f32", "bf16", "q8_0"):
                g = work / f"{shape}-{prec}.gguf"
                if not g.exists():
                    log(f"{shape}: converting to GGUF {prec}")
                    sub(args, "convert", shape=shape, model_dir=mdir, precision=prec, gguf=g, conv=conv)
                ggufs[prec] = g
        figures, loads = {}, {}
        for rnd in range(args.rounds):
            for eng, prec in RUNS:
                if eng not in args.engines or (args.runs and f"{eng}:{prec}" not in args.runs):
                    continue
                if prec == "q8_0-stored" and "q8_0" not in ggufs:
                    continue  # needs llama.cpp's q8_0 file
                loads.setdefault(f"{eng} {prec}", []).append(os.getloadavg()[0])
                log(f"{shape}: round {rnd + 1}/{args.rounds}: {eng} {prec} (load {loads[f'{eng} {prec}'][-1]:.1f})")
                if eng == "ours" and prec == "q8_0-stored":
                    rows, _ = run_ours(args.bench, ggufs["q8_0"], "stored", args.contexts, args.decode, args.threads,
                                       work)
                elif eng == "ours":
                    rows, _ = run_ours(args.bench, mdir, prec, args.contexts, args.decode, args.threads, work)
                elif eng == "llama.cpp":
                    rows = sub(args, "llama.cpp", shape=shape, gguf=ggufs[prec])
                else:
                    rows = sub(args, "transformers", shape=shape, model_dir=mdir, precision=prec)
                figures.setdefault(f"{eng} {prec}", []).append({r["context"]: r for r in rows if "context" in r})
        if not figures:
            log(f"{shape}: no engine ran (models and GGUF files are ready in {work})")
            continue
        text, med = table(shape, figures, args.contexts, loads)
        print(text, flush=True)
        report.append(text)
        raw[shape] = {"rounds": figures, "medians": med, "load_before": loads}
    print(f"\n{args.threads} threads, {args.decode} greedy steps after each prefill, OMP_WAIT_POLICY "
          f"{args.wait_policy}; llama-cpp-python {LLAMA_CPP_PYTHON} (its default f16 K/V); ours: K/V in the model's "
          f"dtype; int8: int8 weights, bfloat16 activations and K/V")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
