#!/usr/bin/env python3
"""The full-width single-block check of the LingBot-World-Fast port (hand-run, never run by CI).

Builds upstream's WanModelFast (Robbyant/lingbot-world 91ff5f6, imported with the CPU stand-ins of
make_dit_fixtures.py) at the release's width with one block: dim 5120, 40 heads, FFN 13824,
text_dim 4096, text_len 512, camera layers, i2v (in_dim 36); random weights (make_dit_fixtures'
rule, rounded to bf16 as the hub stores them); then runs one forward of chunk 0 at the real
480 x 832 latent grid (60 x 104: 4,680 tokens) at t = 999, the first step, in float32 on the
CPU, and times it. Writes into --out:
  config.json, diffusion_pytorch_model.safetensors   the model (bf16), as the hub lays it out
  io.safetensors   x [16, 3, 60, 104], y [20, 3, 60, 104] (mask | image latent), cam
                   [1, 384, 3, 60, 104] (the DiT's camera input), context [20, 4096], t [1],
                   flow [16, 3, 60, 104] (upstream's output)
  time.json        upstream's forward seconds and torch's thread count
Then `wm_bench_dit --lingbot-check OUT` runs ours on the same files and prints both.

  PYTHONPATH=/tmp/lingbot_extra /tmp/torchvenv/bin/python \\
      tools/lingbot_fixtures/make_full_block_check.py --upstream /tmp/lingbot_up --out /tmp/lingbot_full
Memory: about 6 GB (the model in float32 twice while saving, and the activations).
"""

import argparse
import contextlib
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_dit_fixtures as fx  # noqa: E402

CONFIG = dict(model_type="i2v", control_type="cam", text_len=512, in_dim=36, dim=5120, ffn_dim=13824,
              freq_dim=256, text_dim=4096, out_dim=16, num_heads=40, num_layers=1,
              local_attn_size=3, sink_size=0, qk_norm=True, cross_attn_norm=True, eps=1e-6)
LAT_F, LAT_H, LAT_W = 3, 60, 104
CONTEXT_TOKENS = 20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", default="/tmp/lingbot_up")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reduced", action="store_true",
                    help="a quick trial of the same path: dim 128, 2 heads, FFN 256, text_dim 64, a 6 x 8 grid")
    args = ap.parse_args()
    if args.reduced:
        global LAT_H, LAT_W
        CONFIG.update(dim=128, num_heads=2, ffn_dim=256, text_dim=64, text_len=32)
        LAT_H, LAT_W = 6, 8
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    up = fx.load_upstream(os.path.abspath(args.upstream))
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(58)
    with contextlib.redirect_stdout(sys.stderr):
        model = up.fast.WanModelFast(**CONFIG)
    model.eval().requires_grad_(False)
    fx.randomize_(model, up)
    from safetensors.torch import save_file
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
              os.path.join(args.out, "diffusion_pytorch_model.safetensors"))
    cfg = {"_class_name": "WanModelFast", "_diffusers_version": "0.35.1"}
    cfg.update({k: v for k, v in CONFIG.items() if k not in ("qk_norm", "cross_attn_norm")})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    x = fx.fixture_uniform(1, [16, LAT_F, LAT_H, LAT_W])
    msk = torch.zeros(4, LAT_F, LAT_H, LAT_W)
    msk[:, 0] = 1.0
    y = torch.cat([msk, fx.fixture_uniform(2, [16, LAT_F, LAT_H, LAT_W])])
    context = fx.fixture_uniform(3, [CONTEXT_TOKENS, CONFIG["text_dim"]])
    cam = fx.fixture_uniform(4, [1, 384, LAT_F, LAT_H, LAT_W])
    scheduler = up.unipc.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1,
                                                     use_dynamic_shifting=False)
    scheduler.set_timesteps(1000, shift=10.0)
    t = torch.stack([scheduler.timesteps[0]])
    frame_seqlen = LAT_H * LAT_W // 4
    self_kv, cross_kv, kv_size = fx.init_caches(model, frame_seqlen)
    kwargs = {"context": [context], "seq_len": LAT_F * frame_seqlen, "y": [y],
              "dit_cond_dict": {"c2ws_plucker_emb": cam.chunk(1, dim=0)},
              "kv_cache": self_kv, "crossattn_cache": cross_kv, "current_start": 0,
              "max_attention_size": kv_size}
    t0 = time.perf_counter()
    flow = model(x=[x], t=t, **kwargs)[0]
    secs = time.perf_counter() - t0
    print(f"upstream forward: {secs:.1f} s on {torch.get_num_threads()} threads, |flow| max "
          f"{float(flow.abs().max()):.3f}")
    save_file({"x": x, "y": y, "cam": cam, "context": context, "t": t.to(torch.int64), "flow": flow.contiguous()},
              os.path.join(args.out, "io.safetensors"))
    with open(os.path.join(args.out, "time.json"), "w") as f:
        json.dump({"forward_s": secs, "threads": torch.get_num_threads(), "torch": torch.__version__}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
