#!/usr/bin/env python3
"""Multi-turn memory through wm_serve: facts stated early, prose filler, questions late.

Drives wm_serve with the official `openai` client. Each conversation states a few facts about
the user in its first turns ("My locker code is 4821."), then asks the assistant about pieces
of the Debian Administrator's Handbook (filler that pushes the conversation past the KV budget),
then asks about the facts, one question a turn. The assistant's own replies (greedy, generated
by the server) stay in the conversation. Every request names the conversation's session with
X-Session-Id and sends the whole conversation; the server recognises the messages the session
holds and prefills only the new ones (tools/serve/openai_server.cpp, chat_blocks), which the
script checks on every turn through usage.prompt_tokens.

Each memory policy runs on a server of its own, started here (--port 0, SIGTERM at the end):
`full`, `evoke` at each --budgets B, and the recovery-less token-wise policies at the same B.
A question is right when the fact's value occurs in the reply as whole words, after case and
punctuation are normalised (as tools/llm_tasks/prose.cpp's answer_in_reply). Then the same
conversations again across a restart: the first half of the turns on a server with
--state-dir, SIGTERM, a new server on the same folder, the rest of the turns; the replies are
compared with the run without restart (greedy: they should be equal).

Dev and test: the handbook's HTML files in sorted order alternate between the splits (even
index dev, odd test, as prose.cpp); conversation i draws its facts and filler with seed i (dev)
or 2,000,000 + i (test). Tune on dev, report on test.

The defaults are sized for SmolLM2-135M-Instruct (Q4_1), whose recall fades within about a
thousand tokens of its own conversation: see tools/serve_memory/README.md.

Progress goes to stderr; a Markdown table to stdout; everything (every reply) to --json.
"""

import argparse
import gzip
import html
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_BINARY = os.path.join(REPO, "build", "tools", "serve", "wm_serve")
DEFAULT_MODEL = os.path.join(
    os.environ.get("WM_MODEL_CACHE")
    or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "worldmem", "models"),
    "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_PROSE = os.environ.get("WM_PROSE_DIR") or "/usr/share/doc/debian-handbook/html/en-US"
TEST_FIRST_SEED = 2_000_000
TOKENWISE = ["streaming_llm", "snapkv", "h2o"]


def log(msg):
    print(f"[multiturn {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the handbook's paragraphs

def html_to_text(fragment):
    text = re.sub(r"<[^>]*>", "", fragment)
    text = html.unescape(text).replace("\u00a0", " ")
    return " ".join(text.split())


def load_prose(folder):
    """The flat <div class="para"> paragraphs (8 words or more) of every page, by split: files in
    sorted order, even index dev, odd test; a paragraph that occurs more than once is dropped."""
    if not os.path.isdir(folder):
        raise SystemExit(f"multiturn: the filler comes from the Debian Administrator's Handbook in {folder}, "
                         "which is missing: install Debian's package debian-handbook (tools/setup.sh does) "
                         "or pass --prose-dir")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".html"))
    if not names:
        raise SystemExit(f"multiturn: no .html files in {folder}")
    docs = []
    for n in names:
        with open(os.path.join(folder, n), encoding="utf-8", errors="replace") as f:
            page = f.read()
        paras = []
        for m in re.finditer(r'<div class="para">(.*?)</div>', page, re.S):
            inner = m.group(1)
            if "<div" in inner or "<pre" in inner:
                continue
            t = html_to_text(inner)
            if len(t.split()) >= 8:
                paras.append(t)
        docs.append(paras)
    count = {}
    for d in docs:
        for p in d:
            count[p] = count.get(p, 0) + 1
    split = {"dev": [], "test": []}
    for i, d in enumerate(docs):
        split["dev" if i % 2 == 0 else "test"].extend(p for p in d if count[p] == 1)
    return split


# ---------------------------------------------------------------- conversations

NAMES = ["Ilse", "Margit", "Tobias", "Henrike", "Oskar", "Brunhild", "Lorenz", "Wiebke", "Anselm", "Friederike",
         "Quentin", "Ottilie", "Balthasar", "Rosalind", "Ignatius", "Philippa", "Cornelius", "Mathilda",
         "Leopold", "Gudrun", "Casimir", "Ottokar", "Dagmar", "Ludwig"]
PETS = ["Biscuit", "Pepper", "Waffles", "Noodle", "Pickles", "Mango", "Pretzel", "Rocket", "Nugget", "Truffle",
        "Ziggy", "Clover", "Bingo", "Muffin", "Gizmo", "Sprocket", "Domino", "Marble"]
CITIES = ["Lisbon", "Oslo", "Krakow", "Dublin", "Zagreb", "Tallinn", "Valencia", "Porto", "Bergen", "Ghent",
          "Bologna", "Lyon", "Graz", "Riga", "Malmo", "Utrecht", "Turku", "Seville"]

# (kind, statement, question, value generator). The questions ask for the value alone.
FACTS = [
    ("locker", "My locker code is {v}.", "What is my locker code?",
     lambda r: str(r.randrange(1000, 10000))),
    ("sister", "My sister's name is {v}.", "What is my sister's name?", lambda r: r.choice(NAMES)),
    ("dog", "My dog's name is {v}.", "What is my dog's name?", lambda r: r.choice(PETS)),
    ("city", "I live in {v}.", "Which city do I live in?", lambda r: r.choice(CITIES)),
    ("room", "My hotel room number is {v}.", "What is my hotel room number?",
     lambda r: str(r.randrange(100, 1000))),
]

# The facts as named in one question that asks for all of them (--questions one).
ALL_ASK = {"locker": "my locker code", "sister": "my sister's name", "dog": "my dog's name",
           "city": "the city I live in", "room": "my hotel room number"}

FILLER_ASKS = ["Summarize this: ", "What is this paragraph about? ", "Explain this briefly: ",
               "Give me the main point of this text: "]


def conversation_seed(split, index):
    return index if split == "dev" else TEST_FIRST_SEED + index


def filler_texts(rng, paragraphs, count, words):
    """`count` pieces of the handbook, each consecutive paragraphs (in the split's order, so
    mostly of one page) from a random start until they hold `words` words (at most twice that);
    no paragraph twice."""
    used = set()
    out = []
    for _ in range(count):
        for _attempt in range(1000):
            start = rng.randrange(len(paragraphs))
            take, n, k = [], 0, start
            while n < words and k < len(paragraphs) and k not in used:
                take.append(k)
                n += len(paragraphs[k].split())
                k += 1
            if words <= n <= 2 * words:
                break
        else:
            raise SystemExit(f"multiturn: cannot draw {count} fillers of {words}-{2 * words} words "
                             f"from {len(paragraphs)} paragraphs")
        used.update(take)
        out.append(" ".join(paragraphs[k] for k in take))
    return out


def build_conversation(split, index, paragraphs, args):
    """The user's turns of one conversation: the facts, the filler, the questions.
    Each turn is {"kind": "fact"|"filler"|"question", "content": str, ...}."""
    seed = conversation_seed(split, index)
    rng = random.Random(seed * 7919 + 17)
    # The facts of conversation i: --facts kinds of the first --fact-kinds, starting at kind i.
    kinds = [FACTS[(index + j) % args.fact_kinds] for j in range(args.facts)]
    values = {}
    for kind, _, _, gen in kinds:
        values[kind] = gen(rng)
    order = list(kinds)
    rng.shuffle(order)
    if args.fact_turns == "one":
        facts = [{"kind": "fact", "facts": {k: values[k] for k, _, _, _ in order},
                  "content": " ".join(s.format(v=values[k]) for k, s, _, _ in order) + args.fact_suffix}]
    else:
        facts = [{"kind": "fact", "facts": {k: values[k]}, "content": s.format(v=values[k]) + args.fact_suffix}
                 for k, s, _, _ in order]
    fill = [{"kind": "filler", "content": rng.choice(FILLER_ASKS) + text}
            for text in filler_texts(rng, paragraphs, args.filler_turns, args.filler_words)]
    if args.questions == "one":
        listed = [k for k, _, _, _ in order]
        questions = [{"kind": "question", "asks": {k: values[k] for k in listed},
                      "content": args.question_prefix + "Tell me " +
                      (", ".join(ALL_ASK[k] for k in listed[:-1]) + " and " if len(listed) > 1 else "") +
                      ALL_ASK[listed[-1]] + "." + args.question_suffix}]
    else:
        questions = [{"kind": "question", "asks": {k: values[k]},
                      "content": args.question_prefix + q + args.question_suffix} for k, _, q, _ in kinds]
        rng.shuffle(questions)
    return {"split": split, "index": index, "seed": seed, "turns": facts + fill + questions}


# ---------------------------------------------------------------- scoring

def normalize(text):
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def answer_in_reply(reply, answer):
    a = normalize(answer)
    return bool(a) and f" {a} " in f" {normalize(reply)} "


def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


# ---------------------------------------------------------------- the server

class Server:
    """wm_serve in a subprocess: --port 0, the port read from its first stdout line, /health
    waited on; stop() sends SIGTERM and waits."""

    def __init__(self, args, policy, budget, state_dir, log_path):
        self.cmd = [args.binary, "--model", args.model, "--port", "0", "--threads", str(args.threads),
                    "--policy", policy, "--parallel", "1"]
        if budget:
            self.cmd += ["--kv-budget", str(budget)]
        if state_dir:
            self.cmd += ["--state-dir", state_dir]
        self.cmd += args.server_arg
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.log.write((" ".join(self.cmd) + "\n").encode())
        self.log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.log)
        self.port = None
        self.banner = ""
        found = {}

        def read_port():
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                self.log.write(b"stdout: " + raw)
                self.log.flush()
                m = re.search(r"listening on http://[^\s:]+:(\d+)", line)
                if m and "port" not in found:
                    found["port"] = int(m.group(1))
                    found["banner"] = line.strip()

        self.reader = threading.Thread(target=read_port, daemon=True)
        self.reader.start()
        deadline = time.time() + args.start_timeout
        while "port" not in found:
            if self.proc.poll() is not None:
                raise RuntimeError(f"wm_serve exited with status {self.proc.returncode} before listening: "
                                   f"{self.log_tail()}")
            if time.time() > deadline:
                self.kill()
                raise RuntimeError(f"wm_serve printed no port within {args.start_timeout} s: {self.log_tail()}")
            time.sleep(0.05)
        self.port = found["port"]
        self.banner = found["banner"]
        self.base = f"http://127.0.0.1:{self.port}"
        while True:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise RuntimeError(f"wm_serve did not answer /health: {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, n=5):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return " | ".join(lines[-n:])

    def get_json(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return json.loads(r.read().decode())

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            m = re.match(r"^(wm_serve_[a-z_]+)\s+([0-9.eE+-]+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def stop(self, timeout=120):
        """SIGTERM and wait; returns the exit status (an error when it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"wm_serve did not stop within {timeout} s of SIGTERM")
        self.reader.join(timeout=5)
        self.log.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- a conversation against a server

class SessionMismatch(RuntimeError):
    pass


def run_turns(server, model_name, conv, session, turns, history, records, args):
    """Sends turns[i] for i in `turns`, each with the whole conversation so far (history, the
    user's and the assistant's messages, extended in place); appends one record per turn."""
    from openai import OpenAI
    client = OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=600)
    sent = len(history)  # messages the session holds already
    for i in turns:
        turn = conv["turns"][i]
        history.append({"role": "user", "content": turn["content"]})
        if turn["kind"] == "fact" and args.fact_ack:
            # The client's own acknowledgement, sent with the next request: nothing generated.
            history.append({"role": "assistant", "content": args.fact_ack})
            records.append({"turn": i, "kind": "fact", "reply": args.fact_ack, "scripted": True, "ttft_s": None,
                            "time_s": 0.0, "prompt_tokens": 0, "completion_tokens": 0})
            continue
        t0 = time.perf_counter()
        ttft = None
        pieces = []
        usage = None
        stream = client.chat.completions.create(
            model=model_name, messages=history,
            max_tokens=args.question_max_tokens if turn["kind"] == "question" else args.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_headers={"X-Session-Id": session})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        total = time.perf_counter() - t0
        reply = "".join(pieces)
        history.append({"role": "assistant", "content": reply})
        rec = {"turn": i, "kind": turn["kind"], "reply": reply, "ttft_s": ttft if ttft is not None else total,
               "time_s": total, "prompt_tokens": usage.prompt_tokens if usage else None,
               "completion_tokens": usage.completion_tokens if usage else None}
        if turn["kind"] == "question":
            rec.update(asks=turn["asks"], right={k: answer_in_reply(reply, v) for k, v in turn["asks"].items()})
        records.append(rec)
        # The server must have prefilled only the new messages (their tokens plus the chat markup),
        # never the conversation again.
        new_chars = sum(len(m["content"]) for m in history[sent:-1])
        if usage and sent > 0 and usage.prompt_tokens > new_chars + 16 * (len(history) - 1 - sent) + 16:
            raise SessionMismatch(f"turn {i}: the server prefilled {usage.prompt_tokens} tokens for "
                                  f"{new_chars} characters of new messages: it did not recognise the session's messages")
        sent = len(history)


def session_check(server, session, history):
    info = server.get_json(f"/v1/sessions/{session}")
    held = info.get("messages") or []
    want = [m for m in history]
    same = len(held) >= len(want) and all(
        held[len(held) - len(want) + k]["role"] == want[k]["role"] and
        held[len(held) - len(want) + k]["content"] == want[k]["content"] for k in range(len(want)))
    return {"position": info.get("position"), "turns": info.get("turns"), "kv_bytes": info.get("kv_bytes"),
            "messages_match": same}


def run_policy(args, conversations, model_name, label, policy, budget, workdir):
    """Every conversation on one server of `policy`; returns the run's record."""
    log(f"{label}: starting wm_serve --policy {policy}" + (f" --kv-budget {budget}" if budget else ""))
    server = Server(args, policy, budget, None, os.path.join(workdir, f"{label}.log"))
    t0 = time.time()
    convs = []
    try:
        for c in conversations:
            session = f"{c['split']}-{c['index']}"
            history, records = [], []
            ct = time.time()
            run_turns(server, model_name, c, session, range(len(c["turns"])), history, records, args)
            check = session_check(server, session, history)
            right = sum(sum(r["right"].values()) for r in records if r["kind"] == "question")
            nq = sum(len(r["right"]) for r in records if r["kind"] == "question")
            log(f"{label}: conversation {c['split']} {c['index']}: {right}/{nq} right, "
                f"{time.time() - ct:.0f} s, position {check['position']}")
            convs.append({"index": c["index"], "records": records, "session": check})
        metrics = server.metrics()
    finally:
        rc = server.stop()
    return {"label": label, "policy": policy, "budget": budget, "conversations": convs,
            "wall_s": time.time() - t0, "exit_status": rc, "banner": server.banner,
            "evictions": metrics.get("wm_serve_evictions_total"),
            "recoveries": metrics.get("wm_serve_recoveries_total")}


def run_restart(args, conversations, model_name, label, policy, budget, workdir):
    """Every conversation across a restart: its first half of turns on one server with a state
    folder, SIGTERM, the rest on a new server on the same folder."""
    state = os.path.join(workdir, f"{label}.state")
    os.makedirs(state, exist_ok=True)
    t0 = time.time()
    histories = {c["index"]: [] for c in conversations}
    records = {c["index"]: [] for c in conversations}
    cut = {c["index"]: len(c["turns"]) // 2 for c in conversations}
    statuses = []
    for half in (0, 1):
        log(f"{label}: server {half + 1} of 2 (--policy {policy}" + (f" --kv-budget {budget}" if budget else "")
            + f" --state-dir {state})")
        server = Server(args, policy, budget, state, os.path.join(workdir, f"{label}.log"))
        try:
            for c in conversations:
                k = c["index"]
                turns = range(0, cut[k]) if half == 0 else range(cut[k], len(c["turns"]))
                run_turns(server, model_name, c, f"{c['split']}-{k}", turns, histories[k], records[k], args)
        finally:
            statuses.append(server.stop())
        if half == 0:
            log(f"{label}: SIGTERM after the first half, exit status {statuses[-1]}")
    return {"label": label, "policy": policy, "budget": budget, "wall_s": time.time() - t0,
            "exit_status": statuses, "cut": cut,
            "conversations": [{"index": c["index"], "records": records[c["index"]]} for c in conversations]}


# ---------------------------------------------------------------- summaries

def summarize(run):
    qs = [r for c in run["conversations"] for r in c["records"] if r["kind"] == "question"]
    k = sum(sum(r["right"].values()) for r in qs)
    n = sum(len(r["right"]) for r in qs)
    lo, hi = wilson(k, n)
    ttft = [r["ttft_s"] for r in qs]
    return {"right": k, "questions": n, "accuracy": k / n if n else 0.0, "wilson95": [lo, hi],
            "mean_question_ttft_s": sum(ttft) / len(ttft) if ttft else 0.0}


def agreement(restart, base):
    """Replies after the restart equal to the run without restart: (questions, all turns after the cut)."""
    by_index = {c["index"]: c["records"] for c in base["conversations"]}
    q_same = q_n = t_same = t_n = 0
    for c in restart["conversations"]:
        ref = {r["turn"]: r for r in by_index[c["index"]]}
        cut = restart["cut"][c["index"]]
        for r in c["records"]:
            if r["turn"] < cut:
                continue
            same = r["reply"] == ref[r["turn"]]["reply"]
            t_n += 1
            t_same += same
            if r["kind"] == "question":
                q_n += len(r["right"])
                q_same += len(r["right"]) if same else 0
    return {"questions_equal": q_same, "questions": q_n, "turns_equal": t_same, "turns_after_cut": t_n}


def echoed(run):
    """Right answers whose value was already in one of the assistant's filler replies before the
    question: the model carried the fact forward in its own words (recent tokens), so the answer
    says little about the policy's memory of the fact's turn."""
    n = 0
    for c in run["conversations"]:
        for r in c["records"]:
            if r["kind"] != "question":
                continue
            for k, ok in r["right"].items():
                if ok and any(x["kind"] == "filler" and x["turn"] < r["turn"] and answer_in_reply(x["reply"], r["asks"][k])
                              for x in c["records"]):
                    n += 1
    return n


def sizing_of(out):
    """Tokens of each conversation before its first question, from the full cache's run."""
    full_run = next((x for x in out["runs"] if x["policy"] == "full"), None)
    if not full_run:
        return None
    before_q = []
    for c in full_run["conversations"]:
        n = 0
        for r in c["records"]:
            if r["kind"] == "question":
                break
            n += (r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0)
        before_q.append(n)
    return {"tokens_before_first_question": before_q,
            "positions_at_end": [c["session"]["position"] for c in full_run["conversations"]]}


def best_tokenwise(out):
    best = {}
    for b in out["config"]["budgets"]:
        cands = [r for r in out["runs"] if r["budget"] == b and r["policy"] in TOKENWISE]
        if cands:
            top = max(cands, key=lambda r: (r["summary"]["accuracy"], -r["summary"]["mean_question_ttft_s"]))
            best[str(b)] = top["policy"]
    return best


def print_report(out):
    """The Markdown table and the summary lines of a run (live or read back from --json)."""
    cfg = out["config"]
    runs, restarts = out["runs"], out["restarts"]
    conversations = out["conversations"]
    lines = ["| policy | KV budget | right / questions | accuracy (Wilson 95%) | right with the value echoed "
             "in a filler reply | mean TTFT of the questions | blocks banked / recalled (evoke) |",
             "|---|---|---|---|---|---|---|"]
    for r in runs + restarts:
        s = r["summary"]
        name = r["policy"] + (", restarted mid-way" if "agreement" in r else "")
        banked = (f"{r.get('evictions') or 0:.0f} / {r.get('recoveries') or 0:.0f}"
                  if r["policy"] == "evoke" and "agreement" not in r else "")
        lines.append(f"| {name} | {r['budget'] or '-'} | {s['right']} / {s['questions']} | "
                     f"{s['accuracy']:.2f} [{s['wilson95'][0]:.2f}, {s['wilson95'][1]:.2f}] | {echoed(r)} | "
                     f"{s['mean_question_ttft_s'] * 1000:.0f} ms | {banked} |")
    print(f"multi-turn memory, {cfg['split']} split, {len(conversations)} conversations x "
          f"{len(conversations[0]['turns'])} turns ({cfg['facts']} facts, {cfg['filler_turns']} filler, "
          f"{cfg['facts']} questions), {out['model_name']}, --threads {cfg['threads']}, max_tokens "
          f"{cfg['max_tokens']} (questions {cfg['question_max_tokens']}), greedy; {out['date']}")
    print()
    print("\n".join(lines))
    print()
    for b, p in out["best_tokenwise"].items():
        top = next(r for r in runs if str(r["budget"]) == b and r["policy"] == p)["summary"]
        tied = [r["policy"] for r in runs if str(r["budget"]) == b and r["policy"] in TOKENWISE
                and r["summary"]["right"] == top["right"]]
        note = f" (tied with {', '.join(x for x in tied if x != p)}; the lower TTFT named)" if len(tied) > 1 else ""
        print(f"best recovery-less token-wise policy at budget {b}: {p}, {top['right']}/{top['questions']}{note}")
    for r in restarts:
        a = r["agreement"]
        print(f"restart agreement, {r['policy']}" + (f" at {r['budget']}" if r["budget"] else "") +
              f": {a['questions_equal']}/{a['questions']} answers and {a['turns_equal']}/{a['turns_after_cut']} "
              f"replies after the restart equal to the run without restart; server exit statuses {r['exit_status']}")
    if out.get("sizing"):
        t = out["sizing"]["tokens_before_first_question"]
        print(f"tokens before the first question (full cache): min {min(t)}, max {max(t)}; budgets {cfg['budgets']}")
    print(f"run time: {out['elapsed_s']:.0f} s")


def main():
    ap = argparse.ArgumentParser(
        description="Multi-turn memory through wm_serve on a real model: facts early, Debian handbook "
                    "prose as filler, questions late; accuracy per memory policy (Wilson 95%), TTFT, "
                    "and the same conversations across a server restart with --state-dir.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=DEFAULT_BINARY, help="wm_serve")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="the GGUF file (bash tools/get_model.sh smollm2)")
    ap.add_argument("--prose-dir", default=DEFAULT_PROSE, help="the Debian Administrator's Handbook's HTML pages")
    ap.add_argument("--split", choices=["dev", "test"], default="dev",
                    help="dev to tune, test to report (files of the handbook and conversation seeds)")
    ap.add_argument("--conversations", type=int, default=10, help="conversations")
    ap.add_argument("--first", type=int, default=0, help="index of the first conversation in its split")
    ap.add_argument("--facts", type=int, default=3, choices=range(1, len(FACTS) + 1),
                    help="facts per conversation (stated first, asked last)")
    ap.add_argument("--fact-kinds", type=int, default=3, choices=range(1, len(FACTS) + 1),
                    help="the kinds of fact drawn from (locker code, sister's name, dog's name, city, hotel room)")
    ap.add_argument("--filler-turns", type=int, default=6, help="filler turns between the facts and the questions")
    ap.add_argument("--filler-words", type=int, default=60,
                    help="words of every filler turn (consecutive paragraphs of the handbook)")
    ap.add_argument("--fact-turns", choices=["one", "each"], default="each",
                    help="the facts in one message, or a message each")
    ap.add_argument("--fact-ack", default="",
                    help="when given, the assistant's reply to each fact is this text, written by the client and "
                         "sent with the next request (nothing generated for it); empty: the server generates it")
    ap.add_argument("--fact-suffix", default="", help="appended to the facts' message(s)")
    ap.add_argument("--questions", choices=["each", "one"], default="each",
                    help="a question turn per fact, or one turn that asks for every fact (each fact scored)")
    ap.add_argument("--question-prefix", default="", help="put before every question")
    ap.add_argument("--question-suffix", default="", help="appended to every question")
    ap.add_argument("--max-tokens", type=int, default=16, help="max_tokens of the replies to facts and filler (greedy)")
    ap.add_argument("--question-max-tokens", type=int, default=24, help="max_tokens of the replies to questions")
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 512], help="KV budgets in tokens")
    ap.add_argument("--policies", nargs="+", default=["full", "evoke"] + TOKENWISE,
                    help="memory policies (full runs once, without a budget; the others at every budget)")
    ap.add_argument("--restart", choices=["on", "off"], default="on",
                    help="also run evoke (at the first budget) and full across a restart with --state-dir")
    ap.add_argument("--threads", type=int, default=2, help="the server's --threads")
    ap.add_argument("--start-timeout", type=float, default=120, help="seconds a server may take to listen")
    ap.add_argument("--server-arg", action="append", default=[], help="one more wm_serve argument (repeatable)")
    ap.add_argument("--json", help="write everything (every reply) here")
    ap.add_argument("--report", metavar="JSON", help="print the table of a saved --json run (.json or .json.gz) and exit (runs nothing)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (server logs, state folders)")
    args = ap.parse_args()
    if args.report:
        with (gzip.open(args.report, "rt") if args.report.endswith(".gz") else open(args.report)) as f:
            out = json.load(f)
        out["sizing"] = sizing_of(out)
        out["best_tokenwise"] = best_tokenwise(out)
        print_report(out)
        return

    if not (os.path.isfile(args.binary) and os.access(args.binary, os.X_OK)):
        raise SystemExit(f"multiturn: no wm_serve at {args.binary}: build it (cmake --build build --target "
                         "wm_serve) or pass --binary")
    if not os.path.isfile(args.model):
        raise SystemExit(f"multiturn: no model at {args.model}: fetch it with `bash tools/get_model.sh smollm2` "
                         "or pass --model")
    try:
        import openai  # noqa: F401
    except ImportError:
        raise SystemExit("multiturn: needs the `openai` package (pip install openai; the test command's venv "
                         "build/openai-venv has it)")
    if args.conversations < 1 or args.filler_turns < 0 or args.max_tokens < 1:
        raise SystemExit("multiturn: --conversations and --max-tokens must be positive, --filler-turns >= 0")

    t_start = time.time()
    prose = load_prose(args.prose_dir)
    paragraphs = prose[args.split]
    log(f"{args.split} split: {len(paragraphs)} paragraphs")
    conversations = [build_conversation(args.split, args.first + i, paragraphs, args)
                     for i in range(args.conversations)]
    model_name = os.path.basename(args.model)
    if model_name.endswith(".gguf"):
        model_name = model_name[:-5]

    runs = []
    plan = []
    if "full" in args.policies:
        plan.append(("full", "full", None))
    for b in args.budgets:
        for p in args.policies:
            if p != "full":
                plan.append((f"{p}@{b}", p, b))
    workdir = tempfile.mkdtemp(prefix="wm-multiturn.")
    try:
        for label, policy, budget in plan:
            run = run_policy(args, conversations, model_name, label, policy, budget, workdir)
            run["summary"] = summarize(run)
            s = run["summary"]
            log(f"{label}: {s['right']}/{s['questions']} right, mean question TTFT {s['mean_question_ttft_s']:.3f} s, "
                f"{run['wall_s']:.0f} s")
            runs.append(run)
        restarts = []
        if args.restart == "on":
            targets = []
            if "evoke" in args.policies and args.budgets:
                targets.append(("evoke", args.budgets[0]))
            if "full" in args.policies:
                targets.append(("full", None))
            for policy, budget in targets:
                label = f"{policy}@{budget}" if budget else policy
                r = run_restart(args, conversations, model_name, label + "+restart", policy, budget, workdir)
                r["summary"] = summarize(r)
                base = next(x for x in runs if x["label"] == label)
                r["agreement"] = agreement(r, base)
                a = r["agreement"]
                log(f"{r['label']}: {r['summary']['right']}/{r['summary']['questions']} right; after the restart "
                    f"{a['questions_equal']}/{a['questions']} answers and {a['turns_equal']}/{a['turns_after_cut']} "
                    "replies equal to the run without restart")
                restarts.append(r)
    finally:
        if args.keep:
            log(f"work folder kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.time() - t_start
    out = {"config": {k: v for k, v in vars(args).items()}, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "model_name": model_name, "elapsed_s": elapsed, "conversations": conversations,
           "runs": runs, "restarts": restarts}
    out["sizing"] = sizing_of(out)
    out["best_tokenwise"] = best_tokenwise(out)
    print_report(out)
    if args.json:
        tmp = args.json + ".part"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json)
        log(f"wrote {args.json}")

if __name__ == "__main__":
    main()
