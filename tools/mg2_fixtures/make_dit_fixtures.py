#!/usr/bin/env python3
"""Conformance fixtures for the Matrix-Game-2.0 DiT port (hand-run, never run by CI).

Runs the upstream Matrix-Game-2 code itself (CausalWanModel i2v with its ActionModule, built by
WanDiffusionWrapper and driven by CausalInferencePipeline.inference) on the CPU in float32, with
random bf16-rounded weights at reduced widths, and writes per mode (universal, gta_drive, templerun)
  <out>/<mode>/config.json        the reduced config in the hub's format
  <out>/<mode>/model.safetensors  the wrapper's state dict (keys `model.*`), BF16
  <out>/<mode>/io.safetensors     action inputs, per-call timesteps / inputs / outputs, caches
Inputs (noise, image-condition latents, CLIP tokens, re-noising draws) are not stored: they come
from fixture_uniform(), a splitmix64 generator the C++ tests reproduce. See README.md beside this
file for the exact format and for every replacement made to run the upstream code on a CPU.

  /work/venv/bin/python tools/mg2_fixtures/make_dit_fixtures.py            # reduced fixtures
  /work/venv/bin/python tools/mg2_fixtures/make_dit_fixtures.py --full     # full-size universal,
                                                                           # one forward, ~10 GB RAM
"""

import argparse
import contextlib
import copy
import gc
import importlib.machinery
import json
import math
import os
import struct
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_UPSTREAM = "/work/upstream/Matrix-Game-2"
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "dit", "fixtures", "mg2")
DEFAULT_FULL_OUT = "/work/mg2_full"

MODES = ("universal", "gta_drive", "templerun")
MODE_SEED = {"universal": 1001, "gta_drive": 1002, "templerun": 1003}
# denoising_step_list of configs/inference_yaml/inference_<mode>.yaml (warp_denoising_step: true)
MODE_STEPS = {"universal": [1000, 666, 333], "gta_drive": [1000, 666, 333],
              "templerun": [1000, 750, 500, 250]}
FRAME_TOKENS = 880            # 22 x 40 patches of the 44 x 80 latent grid (hard-coded upstream)
LATENT_FRAMES = 9             # 3 chunks of 3
FRAMES_PER_CHUNK = 3
VIDEO_FRAMES = 1 + 4 * (LATENT_FRAMES - 1)   # 33
KV_TOKEN_STRIDE = 29          # every 29th token of the main cache / mouse cache is stored
LATENT_STRIDE = 4             # latents are stored at h % 4 == 0 and w % 4 == 0


# ----------------------------------------------------------------------------------------------
# Deterministic inputs: splitmix64 -> uniform with unit variance (the C++ tests have a twin).
# ----------------------------------------------------------------------------------------------
def fixture_uniform(seed, shape):
    """float32 tensor of `shape`; element i (row-major) = float32((2u - 1) * sqrt(3)), where
    u = (splitmix64((seed << 32) + i) >> 11) * 2^-53, all integer arithmetic mod 2^64."""
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) << np.uint64(32)) + np.arange(n, dtype=np.uint64)
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)
    v = ((2.0 * u - 1.0) * math.sqrt(3.0)).astype(np.float32)
    return torch.from_numpy(v.reshape(shape))


def make_inputs():
    """noise [1,16,9,44,80], cond_concat [1,20,9,44,80], visual_context [1,257,1280]."""
    noise = fixture_uniform(1, [1, 16, LATENT_FRAMES, 44, 80])
    img = fixture_uniform(2, [1, 16, LATENT_FRAMES, 44, 80])
    mask = torch.zeros(1, 4, LATENT_FRAMES, 44, 80)
    mask[:, :, 0] = 1.0
    cond_concat = torch.cat([mask, img], dim=1)
    visual_context = fixture_uniform(3, [1, 257, 1280])
    return noise, cond_concat, visual_context


def make_actions(mode, kd):
    """keyboard_cond [1,33,kd] (multi-hot, one-hot for templerun), mouse_cond [1,33,2] or None."""
    n = VIDEO_FRAMES
    kb = torch.zeros(1, n, kd)
    for i in range(n):
        if mode == "templerun":
            kb[0, i, (i // 3 + 2 * (i % 2)) % kd] = 1.0
        else:
            held = [(i // 5) % 2 == 0, (i % 7) >= 4, ((i + 2) // 3) % 3 == 0, (i // 4) % 3 == 1]
            for j in range(kd):
                kb[0, i, j] = float(held[j])
    if mode == "templerun":
        return kb, None
    ms = torch.zeros(1, n, 2)
    step = [-0.1, 0.0, 0.1]
    for i in range(n):
        ms[0, i, 0] = step[(i // 4) % 3]           # pitch
        ms[0, i, 1] = step[(i // 3 + 1) % 3]       # yaw
    return kb, ms


# ----------------------------------------------------------------------------------------------
# Loading the upstream modules on a CPU.
# ----------------------------------------------------------------------------------------------
class _TorchProxy(types.ModuleType):
    """Stands for `torch` inside one upstream module: every attribute is torch's except the ones
    given as overrides."""

    def __init__(self, name, **overrides):
        super().__init__(name)
        self.__dict__.update(overrides)

    def __getattr__(self, item):
        return getattr(torch, item)


def sdpa_attention(q, k, v, q_lens=None, k_lens=None, dropout_p=0.0, softmax_scale=None,
                   q_scale=None, causal=False, window_size=(-1, -1), deterministic=False,
                   dtype=None, version=None, fa_version=None):
    """fp32 stand-in for wan.modules.attention.{flash_attention,attention}: q [B,Lq,H,D],
    k/v [B,Lk,H,D] -> [B,Lq,H,D] in q's dtype. Only the arguments inference uses are accepted."""
    assert q_lens is None and k_lens is None and q_scale is None and not causal
    assert tuple(window_size) == (-1, -1) and dropout_p == 0.0
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
        scale=softmax_scale)
    return out.transpose(1, 2).contiguous().to(q.dtype)


def flash_attn_func_cpu(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **unused):
    """fp32 stand-in for flash_attn.flash_attn_func on the (B, L, H, D) layout."""
    return sdpa_attention(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale,
                          causal=causal)


def load_upstream(upstream):
    """Imports the upstream modules with the CPU replacements; returns a namespace of them."""
    # diffusers probes for flash_attn when its utils are imported: import them before the stand-in
    # exists so that diffusers does not believe flash_attn is installed.
    import diffusers  # noqa: F401
    import diffusers.configuration_utils  # noqa: F401
    import diffusers.loaders  # noqa: F401
    import diffusers.models.modeling_utils  # noqa: F401

    fa = types.ModuleType("flash_attn")
    fa.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    fa.flash_attn_func = flash_attn_func_cpu
    sys.modules["flash_attn"] = fa

    sys.path.insert(0, upstream)
    for name, sub in (("wan", "wan"), ("wan.modules", os.path.join("wan", "modules"))):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(upstream, sub)]
        pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = pkg
    # Import-only stand-ins for modules whose dependencies are not installed and that inference
    # never calls: the T5 tokenizer (ftfy, transformers), the video writer (cv2).
    tok = types.ModuleType("wan.modules.tokenizers")
    tok.HuggingfaceTokenizer = None
    sys.modules["wan.modules.tokenizers"] = tok
    vis = types.ModuleType("utils.visualize")
    vis.process_video = None
    sys.modules["utils.visualize"] = vis
    # demo_utils.constant allocates 2.1 GB of zero VAE caches that inference() deep-copies and then
    # sets to None: the same list of 32 Nones without the allocation.
    const = types.ModuleType("demo_utils.constant")
    const.ZERO_VAE_CACHE = [None] * 32
    sys.modules["demo_utils.constant"] = const

    # flex_attention is wrapped in torch.compile at import (training path only); compiling is lazy
    # but keep the import independent of the inductor on a CPU-only machine.
    real_compile = torch.compile
    torch.compile = lambda fn=None, *a, **k: fn if fn is not None else (lambda f: f)
    try:
        import wan.modules.attention as attention_mod
        attention_mod.flash_attention = sdpa_attention
        attention_mod.attention = sdpa_attention
        import wan.modules.posemb_layers as posemb
        posemb.torch = _TorchProxy(
            "torch", cuda=types.SimpleNamespace(current_device=lambda: "cpu"))
        import wan.modules.model as model_mod
        import wan.modules.causal_model as causal_mod
        import wan.modules.action_module as action_mod
    finally:
        torch.compile = real_compile
    model_mod.flash_attention = sdpa_attention
    causal_mod.attention = sdpa_attention
    assert action_mod.flash_attn_func is flash_attn_func_cpu

    import utils.wan_wrapper as wan_wrapper
    import pipeline.causal_inference as causal_inference
    return types.SimpleNamespace(model=model_mod, causal=causal_mod, action=action_mod,
                                 wrapper=wan_wrapper, ci=causal_inference)


# ----------------------------------------------------------------------------------------------
# Configs and weights.
# ----------------------------------------------------------------------------------------------
def reduced_config(upstream, mode):
    with open(os.path.join(upstream, "configs", "distilled_model", mode, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(dim=128, num_heads=4, ffn_dim=256, num_layers=4, freq_dim=256, in_dim=36,
               out_dim=16, eps=1e-6, sink_size=0)
    ac = cfg["action_config"]
    ac.update(blocks=[0, 1], heads_num=4, keyboard_hidden_dim=64, hidden_size=32,
              img_hidden_size=128, rope_dim_list=[8, 4, 4])
    if ac["enable_mouse"]:
        ac.update(mouse_hidden_dim=64, mouse_qk_dim_list=[8, 4, 4])
    return cfg


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


@torch.no_grad()
def randomize_(model, up):
    """Overwrites every parameter of a CausalWanModel in place, then rounds it to bf16 and back.
    Linear/Conv weights N(0, 1/fan_in), biases N(0, 0.02^2); norm weights 1 + N(0, 0.1^2);
    LayerNorm biases N(0, 0.02^2); modulations N(0, 1/dim)."""
    rms_types = (up.model.WanRMSNorm, up.action.WanRMSNorm)
    done = set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if isinstance(mod, (torch.nn.Linear, torch.nn.Conv3d)) and pname == "weight":
                fan_in = p[0].numel()
                p.normal_(0.0, 1.0 / math.sqrt(fan_in))
            elif isinstance(mod, (torch.nn.Linear, torch.nn.Conv3d, torch.nn.LayerNorm)) \
                    and pname == "bias":
                p.normal_(0.0, 0.02)
            elif isinstance(mod, torch.nn.LayerNorm) and pname == "weight":
                p.normal_(0.0, 0.1).add_(1.0)
            elif isinstance(mod, rms_types) and pname == "weight":
                p.normal_(0.0, 0.1).add_(1.0)
            elif pname == "modulation":
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
            else:
                raise RuntimeError(f"no random init rule for parameter {full} ({type(mod)})")
            p.copy_(p.to(torch.bfloat16).float())
            done.add(full)
    names = {n for n, _ in model.named_parameters()}
    assert names == done, sorted(names ^ done)


def save_bf16_streaming(path, named_tensors):
    """Writes a safetensors file with every tensor as BF16, one tensor converted at a time."""
    header, offset, items = {}, 0, list(named_tensors)
    for name, t in items:
        nbytes = t.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, t in items:
            b = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy()
            f.write(b.astype("<i2", copy=False).tobytes())


# ----------------------------------------------------------------------------------------------
# Caches (the pipeline's own builders hard-code 30 blocks of 12x128 / 16x64).
# ----------------------------------------------------------------------------------------------
def _index():
    return torch.tensor([0], dtype=torch.long)


def install_cache_builders(pipe, model):
    """Replaces the pipeline's three cache builders by ones sized from `model`; shapes and fields
    as upstream: main k/v [B, local*880, H, D]; keyboard [B, local, Ha, Da]; mouse
    [B*880, local, Ha, Da]; cross-attention [B, 257, H, D] + is_init. Blocks without an action
    module get None for the action caches (upstream allocates them and never reads them)."""
    n_layers, heads, hd = model.num_layers, model.num_heads, model.dim // model.num_heads
    local = model.local_attn_size

    def init_kv(self, batch_size, dtype, device):
        size = local * FRAME_TOKENS
        self.kv_cache1 = [{"k": torch.zeros([batch_size, size, heads, hd], dtype=dtype),
                           "v": torch.zeros([batch_size, size, heads, hd], dtype=dtype),
                           "global_end_index": _index(), "local_end_index": _index()}
                          for _ in range(n_layers)]

    def init_action(self, batch_size, dtype, device):
        kb, ms = [], []
        for blk in model.blocks:
            am = blk.action_model
            if am is None:
                kb.append(None)
                ms.append(None)
                continue
            ah = am.heads_num
            kd = am.mouse_attn_q.out_features // ah
            kb.append({"k": torch.zeros([batch_size, local, ah, kd], dtype=dtype),
                       "v": torch.zeros([batch_size, local, ah, kd], dtype=dtype),
                       "global_end_index": _index(), "local_end_index": _index()})
            if am.enable_mouse:
                md = am.t_qkv.in_features // ah
                ms.append({"k": torch.zeros([batch_size * FRAME_TOKENS, local, ah, md], dtype=dtype),
                           "v": torch.zeros([batch_size * FRAME_TOKENS, local, ah, md], dtype=dtype),
                           "global_end_index": _index(), "local_end_index": _index()})
            else:
                ms.append(None)
        self.kv_cache_keyboard, self.kv_cache_mouse = kb, ms

    def init_cross(self, batch_size, dtype, device):
        self.crossattn_cache = [{"k": torch.zeros([batch_size, 257, heads, hd], dtype=dtype),
                                 "v": torch.zeros([batch_size, 257, heads, hd], dtype=dtype),
                                 "is_init": False} for _ in range(n_layers)]

    pipe._initialize_kv_cache = types.MethodType(init_kv, pipe)
    pipe._initialize_kv_cache_mouse_and_keyboard = types.MethodType(init_action, pipe)
    pipe._initialize_crossattn_cache = types.MethodType(init_cross, pipe)
    pipe.num_transformer_blocks = n_layers


def build_wrapper(up, cfg_dir, seed):
    """WanDiffusionWrapper built from <cfg_dir>/config.json, as inference.py does, with random
    bf16-rounded weights (fp32 storage)."""
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(sys.stderr):
        wrapper = up.wrapper.WanDiffusionWrapper(model_config=cfg_dir, timestep_shift=5.0,
                                                 is_causal=True)
    wrapper.requires_grad_(False)
    randomize_(wrapper.model, up)
    return wrapper


def sub(x):
    return x[..., ::LATENT_STRIDE, ::LATENT_STRIDE].contiguous()


def check_sampler(io, noise, scheduler, steps):
    """Checks the recorded calls against the sampler as documented in README.md, on the stored
    subsamples: x(c,0) = noise chunk; x0 = x - sigma(t) flow; x(c,s+1) = (1 - sigma') x0 +
    sigma' draw(100 + 10c + s) with the draw laid out [F, C, H, W]; the refresh input is x0."""
    sig = {float(t): float(scheduler.sigmas[(scheduler.timesteps - t).abs().argmin()])
           for t in steps}
    n = len(steps)
    worst = 0.0
    for c in range(3):
        got = io[f"c{c}.s0.x_sub"]
        worst = max(worst, (got - sub(noise[:, :, 3 * c:3 * c + 3])).abs().max().item())
        for s in range(n):
            t = float(steps[s])
            assert torch.all(io[f"c{c}.s{s}.t"] == t)
            x = io[f"c{c}.s{s}.x_sub"].double()
            x0 = (x - sig[t] * io[f"c{c}.s{s}.flow_sub"].double()).float()
            if s + 1 < n:
                s1 = sig[float(steps[s + 1])]
                draw = fixture_uniform(100 + 10 * c + s, [3, 16, 44, 80]).permute(1, 0, 2, 3)
                want = (1 - s1) * x0 + s1 * sub(draw[None])
                got = io[f"c{c}.s{s + 1}.x_sub"]
            else:
                want, got = x0, io[f"c{c}.s{n}.x_sub"]
            worst = max(worst, (got - want).abs().max().item())
        assert torch.all(io[f"c{c}.s{n}.t"] == 0)
    assert worst < 1e-5, worst
    return worst


def pipeline_args(mode):
    return types.SimpleNamespace(denoising_step_list=MODE_STEPS[mode], warp_denoising_step=True,
                                 num_frame_per_block=FRAMES_PER_CHUNK, context_noise=0, mode=mode)


# ----------------------------------------------------------------------------------------------
# Reduced fixtures.
# ----------------------------------------------------------------------------------------------
def make_mode(up, mode, out_dir):
    t_start = time.time()
    mdir = os.path.join(out_dir, mode)
    os.makedirs(mdir, exist_ok=True)
    cfg = reduced_config(up.upstream, mode)
    write_json(os.path.join(mdir, "config.json"), cfg)

    wrapper = build_wrapper(up, mdir, MODE_SEED[mode])
    from safetensors.torch import load_file, save_file
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in wrapper.state_dict().items()}
    assert all(k.startswith("model.") for k in sd)
    save_file(sd, os.path.join(mdir, "model.safetensors"))
    # Reload the file into the fp32 model the way inference.py does (strict).
    wrapper.load_state_dict(load_file(os.path.join(mdir, "model.safetensors")), strict=True)
    assert all(p.dtype == torch.float32 for p in wrapper.parameters())
    model = wrapper.model

    noise, cond_concat, visual_context = make_inputs()
    kd = cfg["action_config"]["keyboard_dim_in"]
    keyboard, mouse = make_actions(mode, kd)
    cond = {"cond_concat": cond_concat, "visual_context": visual_context,
            "keyboard_cond": keyboard}
    if mouse is not None:
        cond["mouse_cond"] = mouse

    with contextlib.redirect_stdout(sys.stderr):
        pipe = up.ci.CausalInferencePipeline(pipeline_args(mode), device="cpu", generator=wrapper)
    install_cache_builders(pipe, model)
    n_steps = len(pipe.denoising_step_list)

    io = {"keyboard_cond": keyboard.clone(), "check.uniform": fixture_uniform(7, [16])}
    if mouse is not None:
        io["mouse_cond"] = mouse.clone()
    state = {"calls": 0, "last": None}

    def hook(module, args, kwargs, output):
        c, s = divmod(state["calls"], n_steps + 1)
        state["calls"] += 1
        state["last"] = (c, s)
        x = args[0]
        assert kwargs["current_start"] == 3 * c * FRAME_TOKENS
        io[f"c{c}.s{s}.t"] = kwargs["t"].detach().float().clone()
        io[f"c{c}.s{s}.x_sub"] = sub(x).float()
        io[f"c{c}.s{s}.flow_sub"] = sub(output).float()
        if s == n_steps:
            io[f"c{c}.x0_sub"] = sub(x).float()
            if c == 0:
                io["c0.x0"] = x.detach().float().clone()

    handle = model.register_forward_hook(hook, with_kwargs=True)

    def randn_like(t, **kw):
        c, s = state["last"]
        assert s < n_steps - 1 and t.shape == (FRAMES_PER_CHUNK, 16, 44, 80), (c, s, t.shape)
        # drawn in the layout upstream's loop hands to randn_like: [(B F), C, H, W]
        return fixture_uniform(100 + 10 * c + s, list(t.shape)).to(t.dtype)

    up.ci.torch = _TorchProxy("torch", randn_like=randn_like)

    def fake_vae(latents, *vae_cache):
        # called once per chunk right after its refresh pass: snapshot the caches
        c = state["last"][0]
        assert state["last"][1] == n_steps
        for l in range(model.num_layers):
            kv = pipe.kv_cache1[l]
            g, le = int(kv["global_end_index"]), int(kv["local_end_index"])
            io[f"c{c}.kv{l}.k_sub"] = kv["k"][0, :le][::KV_TOKEN_STRIDE].clone()
            io[f"c{c}.kv{l}.v_sub"] = kv["v"][0, :le][::KV_TOKEN_STRIDE].clone()
            io[f"c{c}.kv{l}.end"] = torch.tensor([g, le], dtype=torch.int64)
            kb = pipe.kv_cache_keyboard[l]
            if kb is not None:
                g, le = int(kb["global_end_index"]), int(kb["local_end_index"])
                io[f"c{c}.kb{l}.k"] = kb["k"][0, :le].clone()
                io[f"c{c}.kb{l}.v"] = kb["v"][0, :le].clone()
                io[f"c{c}.kb{l}.end"] = torch.tensor([g, le], dtype=torch.int64)
            ms = pipe.kv_cache_mouse[l]
            if ms is not None:
                g, le = int(ms["global_end_index"]), int(ms["local_end_index"])
                io[f"c{c}.ms{l}.k_sub"] = ms["k"][::KV_TOKEN_STRIDE, :le].clone()
                io[f"c{c}.ms{l}.v_sub"] = ms["v"][::KV_TOKEN_STRIDE, :le].clone()
                io[f"c{c}.ms{l}.end"] = torch.tensor([g, le], dtype=torch.int64)
        return None, list(vae_cache)

    t_run = time.time()
    try:
        with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
            latents = pipe.inference(noise=noise, conditional_dict=cond, return_latents=True,
                                     vae=fake_vae, mode=mode)
    finally:
        up.ci.torch = torch
        handle.remove()
    run_s = time.time() - t_run
    assert state["calls"] == 3 * (n_steps + 1)
    for c in range(3):
        assert torch.equal(sub(latents[:, :, 3 * c:3 * c + 3]), io[f"c{c}.x0_sub"])

    worst = check_sampler(io, noise, pipe.scheduler, pipe.denoising_step_list)
    print(f"{mode}: sampler relations hold on the stored subsamples, worst |diff| {worst:.2e}")

    io = {k: v.contiguous() for k, v in io.items()}
    save_file(io, os.path.join(mdir, "io.safetensors"))
    total_s = time.time() - t_start
    flows = torch.stack([io[f"c{c}.s{s}.flow_sub"].abs().max() for c in range(3)
                         for s in range(n_steps + 1)])
    x0s = torch.stack([io[f"c{c}.x0_sub"].std() for c in range(3)])
    print(f"{mode}: steps {[round(float(t), 4) for t in pipe.denoising_step_list]}, "
          f"loop {run_s:.1f} s, total {total_s:.1f} s; |flow| max per call "
          f"{[round(float(v), 2) for v in flows]}; x0 std per chunk "
          f"{[round(float(v), 3) for v in x0s]}")
    for name in ("config.json", "model.safetensors", "io.safetensors"):
        print(f"  {name}: {os.path.getsize(os.path.join(mdir, name))} bytes")
    return run_s, total_s


# ----------------------------------------------------------------------------------------------
# Full-size universal model, one forward.
# ----------------------------------------------------------------------------------------------
def make_full(up, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(up.upstream, "configs", "distilled_model", "universal",
                           "config.json")) as f:
        cfg = json.load(f)
    write_json(os.path.join(out_dir, "config.json"), cfg)
    t0 = time.time()
    wrapper = build_wrapper(up, out_dir, MODE_SEED["universal"])
    print(f"full: built and randomized in {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    save_bf16_streaming(os.path.join(out_dir, "model.safetensors"),
                        wrapper.state_dict().items())
    print(f"full: saved in {time.time() - t0:.1f} s", flush=True)
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        sd = wrapper.state_dict()
        assert set(f.keys()) == set(sd.keys())
        for k in ("model.blocks.0.self_attn.q.weight", "model.img_emb.proj.1.weight",
                  "model.blocks.14.action_model.t_qkv.weight", "model.head.modulation"):
            assert torch.equal(f.get_tensor(k).float(), sd[k]), k
        del sd
    gc.collect()

    model = wrapper.model
    noise, cond_concat, visual_context = make_inputs()
    keyboard, mouse = make_actions("universal", cfg["action_config"]["keyboard_dim_in"])
    cond = {"cond_concat": cond_concat, "visual_context": visual_context,
            "keyboard_cond": keyboard, "mouse_cond": mouse}
    with contextlib.redirect_stdout(sys.stderr):
        pipe = up.ci.CausalInferencePipeline(pipeline_args("universal"), device="cpu",
                                             generator=wrapper)
    install_cache_builders(pipe, model)
    pipe._initialize_kv_cache(1, torch.float32, "cpu")
    pipe._initialize_kv_cache_mouse_and_keyboard(1, torch.float32, "cpu")
    pipe._initialize_crossattn_cache(1, torch.float32, "cpu")
    t = pipe.denoising_step_list[0]
    timestep = torch.ones([1, FRAMES_PER_CHUNK], dtype=torch.int64) * t
    chunk_cond = up.ci.cond_current(cond, 0, FRAMES_PER_CHUNK, mode="universal")
    t0 = time.time()
    with torch.no_grad():
        flow, _ = wrapper(noisy_image_or_video=noise[:, :, 0:FRAMES_PER_CHUNK],
                          conditional_dict=chunk_cond, timestep=timestep,
                          kv_cache=pipe.kv_cache1, kv_cache_mouse=pipe.kv_cache_mouse,
                          kv_cache_keyboard=pipe.kv_cache_keyboard,
                          crossattn_cache=pipe.crossattn_cache, current_start=0)
    time_s = time.time() - t0
    from safetensors.torch import save_file
    save_file({"flow": flow.float().contiguous(), "c0.s0.t": timestep.float(),
               "keyboard_cond": keyboard, "mouse_cond": mouse,
               "time_s": torch.tensor([time_s], dtype=torch.float64)},
              os.path.join(out_dir, "io.safetensors"))
    write_json(os.path.join(out_dir, "time.json"),
               {"time_s": time_s, "threads": torch.get_num_threads(),
                "what": "one fp32 CPU forward of CausalWanModel (universal, full size), "
                        "chunk 0 step 0, t=1000, via WanDiffusionWrapper.forward"})
    print(f"full: forward {time_s:.1f} s on {torch.get_num_threads()} threads; "
          f"|flow| max {flow.abs().max():.3f}, std {flow.std():.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", default=DEFAULT_UPSTREAM)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    ap.add_argument("--full", action="store_true",
                    help="full-size universal model, one forward, written to --full-out")
    ap.add_argument("--full-out", default=DEFAULT_FULL_OUT)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    up = load_upstream(os.path.abspath(args.upstream))
    up.upstream = os.path.abspath(args.upstream)
    if args.full:
        make_full(up, args.full_out)
        return
    for mode in args.modes:
        make_mode(up, mode, args.out)


if __name__ == "__main__":
    main()
