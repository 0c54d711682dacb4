"""The official openai client against wm_serve running SmolLM2-135M-Instruct's GGUF file
(tests/cli/openai_client.sh smollm2): the model's id, and the greedy answer to "Name three primary
colors." whole and streamed, with logprobs and 20 alternatives a token, against llama.cpp's on the
same file (tests/llmkv/fixtures/smollm2/chat.json): token for token, or parting from it only at a
near-tie, as tests/llmkv/test_smollm2.cpp's ChatAnswerIsLlamaCpps allows (the rounding of this
machine's kernels decides those). The client parses the logprobs; whole and streamed give the same
entries."""
import faulthandler
import json
import math
import os
import sys

from openai import OpenAI

# A hang prints where the client waits (then exits) before ctest's limit ends the test silently.
faulthandler.dump_traceback_later(150, exit=True)
port = sys.argv[1]
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
model = "SmolLM2-135M-Instruct.Q4_1"
assert [m.id for m in client.models.list().data] == [model]
fixture = os.path.join(os.path.dirname(__file__), "..", "llmkv", "fixtures", "smollm2", "chat.json")
with open(fixture, encoding="utf-8") as f:
    data = json.load(f)["data"]
want_text, want_ids, gaps = data["answer"], data["tokens"], data["gaps"]
# test_smollm2.cpp's kNearTie: twice the largest move of one logit between llama.cpp's own prompt
# and one-token paths (0.82). llama.cpp's top-2 gap where the answers part plus ours must be under it.
NEAR_TIE = 2 * 0.82
TOP = 20


def token_id(entry):
    """The token's id: wm_serve's extension of OpenAI's entry (llama.cpp's server has it too)."""
    extra = entry.model_extra or {}
    assert "id" in extra, f"an entry without its id: {entry}"
    return extra["id"]


def check_entries(entries):
    """The client parsed each entry: its token, bytes, log-probability and TOP alternatives."""
    assert entries, "no logprobs"
    for e in entries:
        assert isinstance(e.token, str) and isinstance(e.logprob, float) and e.logprob <= 0, e
        assert isinstance(e.bytes, list) and all(0 <= b < 256 for b in e.bytes), e
        assert len(e.top_logprobs) == TOP, e
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True), tops
        assert all(isinstance(t.token, str) and isinstance(t.bytes, list) for t in e.top_logprobs), e
        assert sum(math.exp(x) for x in tops) <= 1 + 1e-9, tops
        assert e.logprob == tops[0], f"greedy chose a token less probable than another: {e}"


def as_tuples(entries):
    return [(token_id(e), e.token, e.logprob, e.bytes, [(token_id(t), t.token, t.logprob, t.bytes)
                                                        for t in e.top_logprobs]) for e in entries]


messages = [{"role": "user", "content": "Name three primary colors."}]
ask = dict(model=model, messages=messages, temperature=0, max_tokens=48, logprobs=True, top_logprobs=TOP)
whole = client.chat.completions.create(**ask)
choice = whole.choices[0]
got = choice.message.content
entries = choice.logprobs.content
check_entries(entries)
assert choice.finish_reason == "stop", choice.finish_reason
ids = [token_id(e) for e in entries]
assert len(ids) == whole.usage.completion_tokens, (len(ids), whole.usage)
# The entries' bytes are the answer's, then the end token's (an entry, not text).
answer_bytes = b"".join(bytes(e.bytes) for e in entries[:-1])
assert answer_bytes.decode("utf-8", errors="replace") == got, (answer_bytes, got)
at = 0
while at < len(want_ids) and at < len(ids) and ids[at] == want_ids[at]:
    at += 1
if at == len(want_ids) and len(ids) == len(want_ids):
    assert got == want_text, (got, want_text)
    parted = "llama.cpp's token for token"
else:
    assert at < len(want_ids), f"the answer went on where llama.cpp's ended: {got!r}"
    assert at < len(ids), f"the answer stopped where llama.cpp's went on, token {at}: {got!r}"
    # Ours: our chosen token's log-probability over llama.cpp's token's (a difference of logits).
    theirs_lp = [t.logprob for t in entries[at].top_logprobs if token_id(t) == want_ids[at]]
    assert theirs_lp, (f"llama.cpp's token {want_ids[at]} at token {at} is not among our {TOP} most probable: "
                       f"the answer parts at a clear choice: {got!r}")
    ours = entries[at].logprob - theirs_lp[0]
    assert gaps[at] + ours < NEAR_TIE, (f"the answer parts from llama.cpp's at a clear choice, token {at} "
                                        f"(top-2 gaps there: llama.cpp's {gaps[at]:.4f}, ours {ours:.4f}): {got!r}")
    parted = f"parts from llama.cpp's at token {at} (top-2 gaps there: llama.cpp's {gaps[at]:.4f}, ours {ours:.4f})"

stream = client.chat.completions.create(**ask, stream=True)
streamed, streamed_entries = "", []
for c in stream:
    if not c.choices:
        continue
    delta = c.choices[0].delta.content or ""
    streamed += delta
    if delta:
        assert c.choices[0].logprobs is not None, f"a chunk with text and no logprobs: {c}"
    if c.choices[0].logprobs is not None:
        streamed_entries += c.choices[0].logprobs.content
assert streamed == got, (streamed, got)
assert as_tuples(streamed_entries) == as_tuples(entries), "the stream's logprobs are not the whole answer's"
plain = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48)
assert plain.choices[0].message.content == got, "logprobs changed the greedy answer"
assert plain.choices[0].logprobs is None, plain.choices[0].logprobs
print("openai client vs wm_serve (SmolLM2 GGUF): the answer, whole and streamed:", json.dumps(got), "--", parted,
      "; first entries:", [(e.token, round(e.logprob, 4)) for e in entries[:3]])
