#!/usr/bin/env python3
"""Times the upstream Matrix-Game-2 code on a saved full-size model folder (hand-run, never by CI).

The twin of `wm_bench_dit --mg2-check DIR`: loads DIR (written by
tools/mg2_fixtures/make_dit_fixtures.py --full: config.json, model.safetensors, io.safetensors)
into the upstream WanDiffusionWrapper in float32 on the CPU, runs the same forward (chunk 0,
t = 1000, empty caches, the fixture inputs) with the CPU replacements of that script, and prints
its time and its largest difference to the stored `flow` (0 on the same torch). Lets both
programs be timed back to back on a shared machine.

  OMP_WAIT_POLICY=PASSIVE /work/venv/bin/python tools/bench_dit/time_upstream_forward.py /work/mg2_full --threads 2
"""

import argparse
import contextlib
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mg2_fixtures"))
import make_dit_fixtures as fx  # noqa: E402  (the loaders, inputs and cache builders)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--upstream", default=fx.DEFAULT_UPSTREAM)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", help="also write the times as JSON to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    up = fx.load_upstream(os.path.abspath(args.upstream))

    from safetensors.torch import load_file
    t0 = time.time()
    with contextlib.redirect_stdout(sys.stderr):
        wrapper = up.wrapper.WanDiffusionWrapper(model_config=args.dir, timestep_shift=5.0,
                                                 is_causal=True)
    wrapper.requires_grad_(False)
    wrapper.load_state_dict(load_file(os.path.join(args.dir, "model.safetensors")), strict=True)
    load_s = time.time() - t0
    print(f"upstream: built and loaded in {load_s:.1f} s", file=sys.stderr, flush=True)
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    mode = "universal"
    assert cfg["action_config"]["keyboard_dim_in"] == 4 and cfg["action_config"]["enable_mouse"]

    model = wrapper.model
    noise, cond_concat, visual_context = fx.make_inputs()
    keyboard, mouse = fx.make_actions(mode, cfg["action_config"]["keyboard_dim_in"])
    cond = {"cond_concat": cond_concat, "visual_context": visual_context,
            "keyboard_cond": keyboard, "mouse_cond": mouse}
    io = load_file(os.path.join(args.dir, "io.safetensors"))
    with contextlib.redirect_stdout(sys.stderr):
        pipe = up.ci.CausalInferencePipeline(fx.pipeline_args(mode), device="cpu", generator=wrapper)
    fx.install_cache_builders(pipe, model)
    t = pipe.denoising_step_list[0]
    timestep = torch.ones([1, fx.FRAMES_PER_CHUNK], dtype=torch.int64) * t
    chunk_cond = up.ci.cond_current(cond, 0, fx.FRAMES_PER_CHUNK, mode=mode)
    times = []
    for r in range(args.repeats):
        # fresh caches each time: the cross-attention K/V are computed inside the timed call
        pipe._initialize_kv_cache(1, torch.float32, "cpu")
        pipe._initialize_kv_cache_mouse_and_keyboard(1, torch.float32, "cpu")
        pipe._initialize_crossattn_cache(1, torch.float32, "cpu")
        t0 = time.time()
        flow, _ = wrapper(noisy_image_or_video=noise[:, :, 0:fx.FRAMES_PER_CHUNK],
                          conditional_dict=chunk_cond, timestep=timestep,
                          kv_cache=pipe.kv_cache1, kv_cache_mouse=pipe.kv_cache_mouse,
                          kv_cache_keyboard=pipe.kv_cache_keyboard,
                          crossattn_cache=pipe.crossattn_cache, current_start=0)
        times.append(time.time() - t0)
        diff = (flow.float() - io["flow"]).abs().max().item()
        print(f"upstream forward {r + 1}: {times[-1]:.2f} s on {torch.get_num_threads()} threads; "
              f"max |flow - stored flow| {diff:.3e}", flush=True)
    if args.json:
        tmp = args.json + ".part"
        with open(tmp, "w") as f:
            json.dump({"what": "upstream CausalWanModel forward, chunk 0 step 0, t=1000, fp32 CPU",
                       "dir": args.dir, "threads": torch.get_num_threads(), "load_s": load_s,
                       "time_s": times, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")},
                      f, indent=2)
            f.write("\n")
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
