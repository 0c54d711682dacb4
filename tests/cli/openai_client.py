"""wm_serve through the official openai Python client: a chat completion whole and streamed (the
same text), its logprobs as the client parses them (whole and streamed the same; a text
completion's older form), a text completion, a session continued over two requests
(X-Session-Id), the session read back, and an error the client raises as it should. Run by
openai_client.sh."""
import faulthandler
import json
import sys
import urllib.request

import openai

# A hang prints where the client waits (then exits) before ctest's limit ends the test silently.
faulthandler.dump_traceback_later(150, exit=True)

port = int(sys.argv[1])
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
models = [m.id for m in client.models.list().data]
assert models == ["tiny-llm"], models

messages = [{"role": "user", "content": "Recall fada: 3117. Recall fada?"}]
whole = client.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=12, temperature=0)
text = whole.choices[0].message.content
assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0, whole.usage
streamed = "".join(
    (c.choices[0].delta.content or "")
    for c in client.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=12, temperature=0, stream=True)
    if c.choices
)
assert streamed == text, (streamed, text)

# Logprobs as the client parses them: one entry per generated token, whole and streamed the same.
lp = client.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=12, temperature=0, logprobs=True,
                                    top_logprobs=3)
entries = lp.choices[0].logprobs.content
assert lp.choices[0].message.content == text and len(entries) == lp.usage.completion_tokens, (lp, entries)
assert all(len(e.top_logprobs) == 3 and e.logprob == e.top_logprobs[0].logprob and isinstance(e.bytes, list)
           for e in entries), entries
streamed_entries = [e for c in client.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=12,
                                                             temperature=0, logprobs=True, top_logprobs=3, stream=True)
                    if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
assert [(e.token, e.logprob, e.bytes) for e in streamed_entries] == [(e.token, e.logprob, e.bytes) for e in entries]
older = client.completions.create(model="tiny-llm", prompt="rode 42\nsora 17\nRecall:\nrode", max_tokens=3,
                                  temperature=0, logprobs=2).choices[0].logprobs
assert len(older.tokens) == 3 and len(older.token_logprobs) == 3 and older.text_offset[0] == 0, older
assert all(len(t) == 2 for t in older.top_logprobs), older

completion = client.completions.create(model="tiny-llm", prompt="rode 42\nsora 17\nRecall:\nrode", max_tokens=3,
                                       temperature=0)
assert completion.choices[0].text.startswith(" 42"), repr(completion.choices[0].text)

# A session over two requests: the second sends only its new message.
session = {"X-Session-Id": "openai-client"}
first = client.completions.create(model="tiny-llm", prompt="rode 42\nsora 17\n", max_tokens=1, temperature=0,
                                  extra_headers=session)
second = client.completions.create(model="tiny-llm", prompt="Recall:\nsora", max_tokens=3, temperature=0,
                                   extra_headers=session)
assert second.choices[0].text.startswith(" 17"), repr(second.choices[0].text)
info = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/sessions/openai-client", timeout=60))
assert info["turns"] == 2 and info["last_reply"] == second.choices[0].text, info

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
    raise AssertionError("an unknown model was served")
except openai.NotFoundError as e:
    assert e.body["param"] == "model", e.body

print(f"openai {openai.__version__}: chat whole and streamed {text!r}; completion {completion.choices[0].text!r}; "
      f"session continued {second.choices[0].text!r}; unknown model -> 404")
