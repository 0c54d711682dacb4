#!/usr/bin/env python3
"""Reference fixtures for the Llama / Qwen2 decoder (llmkv/model.h, llmkv/hf_folder.h).

Run by hand, not in CI (needs PyPI packages):
    pip install torch transformers safetensors
    python3 tools/llm_fixtures/make_model_fixtures.py [--out tests/llmkv/fixtures/models]

Builds two random-weight models with the reference `transformers` classes, saves them as Hugging
Face folders and records the logits that the reference computes for fixed prompts:
  qwen2_tiny: Qwen2ForCausalLM, q/k/v biases, GQA (4 heads, 2 kv heads), tied embeddings, one
              model.safetensors, config.json as transformers writes it (rope_parameters), eos as
              a list.
  llama_tiny: LlamaForCausalLM, GQA, separate lm_head, rope_theta 500000, head_dim 32 (not
              hidden / heads), sharded (model.safetensors.index.json + shards), config.json in
              the older layout most published checkpoints use (rope_theta, rope_scaling null).
Each folder also holds reference.safetensors: input_ids [S, T] int64 and logits [S, T, vocab]
float32 (every position), computed with attn_implementation="eager" in float32 by the model
loaded back from the folder, so the reference reads the same files the C++ loader reads.

Weights are random but not at HF's tiny initialisation: every linear is N(0, 1/fan_in), embeddings
N(0, 0.3^2), biases and norm weights perturbed, so that every tensor visibly changes the logits.
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SEQ_LEN = 32
N_PROMPTS = 3


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:  # linear weight [out, in]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def prompts(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (N_PROMPTS, SEQ_LEN), generator=g, dtype=torch.int64)


def build(cls, config, folder, seed, shard_size=None, legacy_config=False):
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    randomise(model, seed)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    kwargs = {"safe_serialization": True}
    if shard_size:
        kwargs["max_shard_size"] = shard_size
    model.save_pretrained(folder, **kwargs)
    if legacy_config:
        # The layout of most published checkpoints: rope_theta at the top, rope_scaling null.
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        rp = cfg.pop("rope_parameters")
        assert rp.get("rope_type", "default") == "default"
        cfg["rope_theta"] = rp["rope_theta"]
        cfg["rope_scaling"] = None
        cfg["torch_dtype"] = cfg.pop("dtype", "float32")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    reloaded = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    ids = prompts(config.vocab_size, seed + 1)
    with torch.no_grad():
        logits = reloaded(input_ids=ids).logits.float().contiguous()
        direct = model(input_ids=ids).logits.float()
    assert torch.allclose(logits, direct, atol=1e-5), "the saved folder does not reproduce the model"
    save_file({"input_ids": ids.contiguous(), "logits": logits}, os.path.join(folder, "reference.safetensors"))
    sizes = {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}
    print(folder, sizes, "logits std %.3f" % logits.std().item())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "llmkv", "fixtures", "models"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()

    qwen = Qwen2Config(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=[2, 3], use_sliding_window=False,
        attn_implementation="eager")
    build(Qwen2ForCausalLM, qwen, os.path.join(args.out, "qwen2_tiny"), seed=1234)

    llama = LlamaConfig(
        vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, attention_bias=False,
        attn_implementation="eager")
    build(LlamaForCausalLM, llama, os.path.join(args.out, "llama_tiny"), seed=4321, shard_size="300KB",
          legacy_config=True)


if __name__ == "__main__":
    main()
