#!/usr/bin/env python3
"""transformers' logits on SmolLM2-135M-Instruct's GGUF file, as a small JSON fixture that
tests/llmkv/test_smollm2.cpp holds the project's float mode to. Run by hand:

  python3 -m venv /tmp/torchvenv
  /tmp/torchvenv/bin/pip install torch transformers gguf
  M=$(bash tools/get_model.sh smollm2)
  /tmp/torchvenv/bin/python tools/gguf_fixtures/transformers_reference.py --model "$M"

transformers loads the file with `from_pretrained(dir, gguf_file=...)`, which decodes every tensor
to float32 with gguf-py (and undoes the converter's Q/K row permutation itself), and runs its own
Llama in float32 with eager attention. The prompts are the token ids of logits.json (written by
llamacpp_reference.py), so both references see the same 3 x 64 tokens.

Writes tests/llmkv/fixtures/smollm2/logits_transformers.json: per prompt and position the top 20
logits, the log-sum-exp of the row and the row's largest |logit| (the scale a relative difference
is measured against).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import transformers

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "llmkv", "fixtures", "smollm2")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default=FIXTURES)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    folder, name = os.path.split(os.path.abspath(a.model))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    with open(os.path.join(a.out, "logits.json"), encoding="utf-8") as f:
        prompts = json.load(f)["data"]
    out = []
    for p in prompts:
        ids = torch.tensor([p["tokens"]], dtype=torch.long)
        with torch.no_grad():
            logits = model(ids).logits[0].to(torch.float64).numpy()
        rows = []
        for row in logits:
            idx = np.argsort(-row, kind="stable")[:20]
            m = float(np.max(row))
            rows.append({"top": [[int(i), float(row[i])] for i in idx],
                         "logsumexp": m + math.log(float(np.sum(np.exp(row - m)))),
                         "absmax": float(np.max(np.abs(row)))})
        out.append({"tokens": p["tokens"], "positions": rows})
        print("transformers_reference: prompt of", len(p["tokens"]), "tokens done", file=sys.stderr, flush=True)
    out_path = os.path.join(a.out, "logits_transformers.json")
    with open(out_path, "w", encoding="utf-8") as f:
        meta = {"reference": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                "model": os.path.basename(a.model), "attention": "eager", "dtype": "float32"}
        json.dump({"meta": meta, "data": out}, f, separators=(",", ":"))
    print("transformers_reference: wrote", out_path, file=sys.stderr)


if __name__ == "__main__":
    main()
