"""Writes the seed corpus of the fuzz target fuzz_llm_weights (tests/fuzz/corpus/llm_weights/):
each seed is a config.json's text, one NUL byte, then a safetensors file. Tiny shapes (a vocabulary
of 8, hidden size 4) keep each seed near 1-3 KB.

    /work/venv/bin/python tools/llm_fixtures/make_weights_fuzz_seeds.py

Seeds: a Qwen2 config with tied embeddings and its weights (they agree), the same weights beside a
config whose vocab_size is one larger (they disagree), and an untied Llama with attention and MLP
biases plus a rotary buffer older checkpoints carry (they agree). Values are small integers in
float32, written with the safetensors package (safetensors.numpy.save).
"""
import json
import os

import numpy as np
from safetensors.numpy import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fuzz", "corpus", "llm_weights")


def params(cfg):
    """The parameters of a config, by Hugging Face name, as llmkv/weight_shapes.h lists them."""
    v, d, i = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    qwen = cfg["model_type"] == "qwen2"
    qkv_bias = qwen or cfg.get("attention_bias", False)
    o_bias = not qwen and cfg.get("attention_bias", False)
    mlp_bias = cfg.get("mlp_bias", False)
    out = {"model.embed_tokens.weight": (v, d)}
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        out[pre + "input_layernorm.weight"] = (d,)
        for name, rows, cols, bias in [("self_attn.q_proj", q, d, qkv_bias), ("self_attn.k_proj", kv, d, qkv_bias),
                                       ("self_attn.v_proj", kv, d, qkv_bias), ("self_attn.o_proj", d, q, o_bias),
                                       ("mlp.gate_proj", i, d, mlp_bias), ("mlp.up_proj", i, d, mlp_bias),
                                       ("mlp.down_proj", d, i, mlp_bias)]:
            out[pre + name + ".weight"] = (rows, cols)
            if bias:
                out[pre + name + ".bias"] = (rows,)
        out[pre + "post_attention_layernorm.weight"] = (d,)
    out["model.norm.weight"] = (d,)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, d)
    return out


def tensors(shapes, extra=None):
    out = {}
    for k, (name, shape) in enumerate(sorted(shapes.items())):
        out[name] = (np.arange(int(np.prod(shape)), dtype=np.float32) % 7 - 3 + k % 3).reshape(shape)
    out.update(extra or {})
    return out


def write(name, cfg, ts):
    blob = json.dumps(cfg, separators=(",", ":")).encode() + b"\0" + save(ts, metadata={"format": "pt"})
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(blob)
    print(name, len(blob), "bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    qwen = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2,
            "tie_word_embeddings": True, "eos_token_id": 0}
    write("qwen2_agree", qwen, tensors(params(qwen)))
    write("qwen2_vocab_disagrees", dict(qwen, vocab_size=9), tensors(params(qwen)))
    llama = {"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 6,
             "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2,
             "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True}
    rot = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(1, dtype=np.float32)}
    write("llama_untied_biases", llama, tensors(params(llama), rot))


if __name__ == "__main__":
    main()
