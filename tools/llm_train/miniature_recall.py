#!/usr/bin/env python3
"""Associative recall in miniature, on transformers' own Qwen2ForCausalLM: how many steps until a
small decoder learns to look a value up by its key, and what changes that. Run by hand (needs
`pip install torch transformers`); CI never runs it. The README's "Where training stands" quotes
its figures.

A sequence is `k1 v1 k2 v2 ... kn vn` then the same keys in a shuffled order, each followed by its
value; keys are distinct tokens of [0, nk), values tokens of [nk, 2 nk). The loss is on the
queried values (or, with --context-weight w > 0, on every next token, values weighing 1 and the
rest w, as wm_llm_train weighs them). Prints, every 100 steps: step, pairs, loss, and the recall
accuracy of fresh sequences of 6, 24 and 48 pairs (-1 where nk is too small for them), with the
--prefix line, and with --prefix also that of 6 pairs without it.

  python3 tools/llm_train/miniature_recall.py                          # 2 layers of 64, 6 pairs
  python3 tools/llm_train/miniature_recall.py --qk-init 0.05            # mimetic attention init
  python3 tools/llm_train/miniature_recall.py --weight-decay 0.1 --beta2 0.95 --clip 1 \\
      --context-weight 0.1 --qk-init 0.05                               # wm_llm_train's settings
"""
import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default="6:1500",
                   help="pairs:steps[:prefix],... in order; pairs may be a range lo-hi drawn per step; "
                        "prefix (default --prefix) is the stage's prefix length, at most --prefix, or "
                        "lengths joined by + (0+20: half the batch without, half with a 20-token prefix)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=128, help="sequences per step")
    p.add_argument("--keys", type=int, default=64, help="distinct keys (and values): nk")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=0, help="0: 2 x hidden")
    p.add_argument("--qk-init", type=float, default=0.0,
                   help="mimetic init: queries start as their group's keys, both of this std (0: off)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--clip", type=float, default=0.0, help="gradient norm clip (0: none)")
    p.add_argument("--context-weight", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", type=int, default=0,
                   help="a fixed line of this many tokens before every sequence (as mqar's instruction)")
    p.add_argument("--prefix-random", action="store_true",
                   help="draw the prefix line's tokens afresh for every sequence (from its own N tokens)")
    p.add_argument("--newlines", action="store_true",
                   help="a newline token after every value, in the list and in the answers (as mqar's lines)")
    a = p.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    nk = a.keys
    newline, prefix_base = 2 * nk, 2 * nk + 1  # extra tokens: the newline, then the prefix's
    vocab = prefix_base + a.prefix
    prefix = torch.arange(prefix_base, prefix_base + a.prefix)
    width = 3 if a.newlines else 2  # tokens per pair
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.intermediate or 2 * a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      head_dim=a.hidden // a.heads, tie_word_embeddings=True, rope_theta=10000.0,
                      initializer_range=0.02, max_position_embeddings=1024, attn_implementation="eager")
    model = Qwen2ForCausalLM(cfg)
    model.train()
    if a.qk_init > 0:
        with torch.no_grad():
            group = a.heads // a.kv_heads
            for layer in model.model.layers:
                att, hd = layer.self_attn, layer.self_attn.head_dim
                att.k_proj.weight.mul_(a.qk_init / cfg.initializer_range)
                for h in range(a.heads):
                    g = h // group
                    att.q_proj.weight[h * hd:(h + 1) * hd] = att.k_proj.weight[g * hd:(g + 1) * hd]
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay, betas=(0.9, a.beta2))

    def sequences(pairs, n, plen=None):
        plen = a.prefix if plen is None else plen
        keys = torch.rand(n, nk).argsort(1)[:, :pairs]
        vals = torch.randint(nk, (n, pairs)) + nk
        order = torch.rand(n, pairs).argsort(1)
        parts = [[keys, vals], [keys.gather(1, order), vals.gather(1, order)]]
        if a.newlines:
            for part in parts:
                part.append(torch.full((n, pairs), newline))
        listed, asked = (torch.stack(part, 2).reshape(n, -1) for part in parts)
        pre = prefix[:plen].expand(n, -1)
        if a.prefix_random and plen > 0:
            pre = torch.randint(prefix_base, prefix_base + a.prefix, (n, plen))
        return torch.cat([pre, listed, asked], 1)

    def answer_positions(pairs, plen=None):
        return (a.prefix if plen is None else plen) + torch.arange(width * pairs + 1, 2 * width * pairs, width)

    def accuracy(pairs, plen=None):
        if pairs > nk:
            return -1
        with torch.no_grad():
            tok = sequences(pairs, 64, plen)
            i = answer_positions(pairs, plen)
            logits = model(tok).logits
            return round((logits[:, i - 1].argmax(-1) == tok[:, i]).float().mean().item(), 3)

    t0, step = time.time(), 0
    for stage in a.stages.split(","):
        pr, n, *rest = stage.split(":")
        plens = [int(x) for x in rest[0].split("+")] if rest else [a.prefix]
        if max(plens) > a.prefix:
            p.error(f"stage {stage}: a prefix is longer than --prefix {a.prefix}")
        lo, hi = map(int, pr.split("-")) if "-" in pr else (int(pr), int(pr))
        for k in range(int(n)):
            pairs = int(torch.randint(lo, hi + 1, (1,)))
            loss = 0.0
            for plen in plens:  # the batch split evenly between the stage's prefix lengths
                tok = sequences(pairs, a.batch // len(plens), plen)
                i = answer_positions(pairs, plen)
                logits = model(tok).logits
                if a.context_weight > 0:
                    w = torch.full((tok.shape[1] - 1,), a.context_weight)
                    w[i - 1] = 1.0
                    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), tok[:, 1:].reshape(-1),
                                                            reduction="none").view(tok.shape[0], -1)
                    part = (nll * w).sum() / (w.sum() * tok.shape[0])
                else:
                    part = torch.nn.functional.cross_entropy(logits[:, i - 1].reshape(-1, vocab), tok[:, i].reshape(-1))
                loss = loss + part / len(plens)
            opt.zero_grad()
            loss.backward()
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            step += 1
            if k % 100 == 0 or k == int(n) - 1:
                bare = f" acc@6 without prefix {accuracy(6, 0)}" if a.prefix > 0 else ""
                print(step, pairs, round(loss.item(), 3), "acc@6", accuracy(6), "@24", accuracy(24), "@48",
                      accuracy(48), bare, f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
