"""The official openai client against wm_serve running SmolLM2-135M-Instruct's GGUF file
(tests/cli/openai_client.sh smollm2): the model's id, and the greedy answer to "Name three primary
colors." whole and streamed, which is llama.cpp's on the same file token for token
(tests/llmkv/fixtures/smollm2/chat.json)."""
import faulthandler
import json
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
    want = json.load(f)["data"]["answer"]
messages = [{"role": "user", "content": "Name three primary colors."}]
whole = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48)
got = whole.choices[0].message.content
assert got == want, (got, want)
assert whole.choices[0].finish_reason == "stop", whole.choices[0].finish_reason
stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48, stream=True)
streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
assert streamed == want, (streamed, want)
print("openai client vs wm_serve (SmolLM2 GGUF): the answer, whole and streamed:", json.dumps(got))
