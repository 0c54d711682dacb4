#!/usr/bin/env python3
"""Conformance fixtures for the LingBot-World-Fast DiT port (hand-run, never run by CI).

Imports the first-generation upstream code (Robbyant/lingbot-world at commit 91ff5f6, Apache-2.0:
wan/modules/model_fast.py, wan/utils/cam_utils.py, wan/utils/fm_solvers_unipc.py and
WanI2VFast._convert_flow_pred_to_x0 of wan/image2video_fast.py) from a fetched copy, builds a
seeded random WanModelFast of reduced size on the CPU in float32, and drives it with the loop of
WanI2VFast.generate (4 steps at scheduler indices [0, 179, 358, 679] with shift 10, chunks of 3
latent frames, the clean t = 0 pass writing the cache, a rolling KV cache with a sink), with the
noise passed in. It writes, under tests/dit/fixtures/lingbot/:
  config.json                         the reduced model config (diffusers' format, as the hub)
  diffusion_pytorch_model.safetensors the state dict, Wan-native keys, BF16
  io.safetensors                      camera inputs and their preprocessing, every DiT call's
                                      timestep / input / output, the KV caches after each chunk
Inputs (noise, image latent, text context, re-noising draws) are not stored: they come from
fixture_uniform(), the splitmix64 generator of tools/mg2_fixtures, which the C++ tests reproduce.
See README.md beside this file.

  PYTHONPATH=/tmp/lingbot_extra /tmp/torchvenv/bin/python \
      tools/lingbot_fixtures/make_dit_fixtures.py --upstream /tmp/lingbot_up
"""

import argparse
import contextlib
import importlib.machinery
import json
import math
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "dit", "fixtures", "lingbot")

# The reduced model: WanModelFast's constructor arguments (text_dim, cross_attn_norm, qk_norm and
# patch_size are in upstream's ignore_for_config: the real model takes their defaults 4096, True,
# True, (1, 2, 2)).
CONFIG = dict(model_type="i2v", control_type="cam", text_len=16, in_dim=36, dim=64, ffn_dim=128,
              freq_dim=256, text_dim=32, out_dim=16, num_heads=2, num_layers=3,
              local_attn_size=9, sink_size=3, qk_norm=True, cross_attn_norm=True, eps=1e-6)
SEED = 2024
CHUNK = 3                      # latent frames a chunk (generate_fast.py passes chunk_size=3)
LAT_F, LAT_H, LAT_W = 15, 6, 8  # 5 chunks; 3 x 4 patches = 12 tokens a latent frame
PIX_H, PIX_W = 8 * LAT_H, 8 * LAT_W
VIDEO_FRAMES = 61              # poses given per video frame; interpolated to 15 latent frames
CONTEXT_TOKENS = 10            # text tokens before zero padding to text_len
TIMESTEPS_INDEX = [0, 179, 358, 679]
SHIFT = 10.0
KV_TOKEN_STRIDE = 5            # every 5th token of the caches is stored
RAY_FRAMES = 3                 # the folded rays of the first 3 latent frames are stored (the
                               # unfolded rays of the first one)


# ----------------------------------------------------------------------------------------------
# Deterministic inputs: the generator of tools/mg2_fixtures/make_dit_fixtures.py.
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


def camera_path():
    """c2ws [61, 4, 4] float32 (OpenCV convention, as poses.npy) and intrinsics [61, 4]
    (fx, fy, cx, cy for a 480 x 832 image, as intrinsics.npy): a turning, bobbing walk whose
    speed varies (so the trajectory's largest step is not its first)."""
    poses = np.zeros((VIDEO_FRAMES, 4, 4), dtype=np.float64)
    for i in range(VIDEO_FRAMES):
        yaw, pitch, roll = 0.03 * i + 0.2 * math.sin(i / 7.0), 0.1 * math.sin(i / 11.0), 0.02 * math.cos(i / 5.0)
        cy, sy, cp, sp, cr, sr = (math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch),
                                  math.cos(roll), math.sin(roll))
        ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
        rx = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
        rz = np.array([[cr, -sr, 0], [sr, cr, 0], [0, 0, 1]])
        poses[i, :3, :3] = ry @ rx @ rz
        speed = 0.05 + 0.04 * math.sin(i / 9.0) ** 2
        poses[i, :3, 3] = [0.3 * math.sin(i / 13.0), 0.02 * math.sin(i / 3.0), speed * i]
        poses[i, 3, 3] = 1.0
    ks = np.tile(np.array([[480.0, 470.0, 416.0, 240.0]]), (VIDEO_FRAMES, 1))
    ks[:, 0] += np.arange(VIDEO_FRAMES) * 0.5  # per-frame values; upstream uses frame 0's only
    return poses.astype(np.float32), ks.astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Loading the upstream modules on a CPU.
# ----------------------------------------------------------------------------------------------
def sdpa_attention(q, k, v, q_lens=None, k_lens=None, dropout_p=0.0, softmax_scale=None,
                   q_scale=None, causal=False, window_size=(-1, -1), deterministic=False,
                   dtype=None, version=None, fa_version=None):
    """fp32 stand-in for wan.modules.attention.{flash_attention,attention}: q [B,Lq,H,D],
    k/v [B,Lk,H,D] -> [B,Lq,H,D] in q's dtype (upstream's `attention` would cast to bf16 and
    flash_attention asserts CUDA). Only the arguments inference uses are accepted."""
    assert q_lens is None and k_lens is None and q_scale is None and not causal
    assert tuple(window_size) == (-1, -1) and dropout_p == 0.0
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
        scale=softmax_scale)
    return out.transpose(1, 2).contiguous().to(q.dtype)


def _stub(name, **attrs):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load_upstream(upstream):
    """Imports the upstream modules with the CPU replacements; returns a namespace of them."""
    import diffusers.configuration_utils  # noqa: F401  (before any flash_attn stand-in)
    import diffusers.models.modeling_utils  # noqa: F401
    # t5.py evaluates torch.cuda.current_device() as a default argument at import: patched
    # (t5 is imported by image2video_fast, never called here).
    torch.cuda.current_device = lambda: "cpu"
    sys.path.insert(0, upstream)
    for name, sub in (("wan", "wan"), ("wan.modules", os.path.join("wan", "modules")),
                      ("wan.utils", os.path.join("wan", "utils")),
                      ("wan.distributed", os.path.join("wan", "distributed"))):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(upstream, sub)]
        pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = pkg
    # Import-only stand-ins for what image2video_fast imports and the DiT loop never calls: the
    # T5 tokenizer (ftfy), torchvision's image transforms, the VAE, the distributed helpers.
    _stub("wan.modules.tokenizers", HuggingfaceTokenizer=None)
    tv = _stub("torchvision")
    tv.transforms = _stub("torchvision.transforms")
    tv.transforms.functional = _stub("torchvision.transforms.functional")
    _stub("wan.modules.vae2_1", Wan2_1_VAE=None)
    _stub("wan.distributed.fsdp", shard_model=None)
    _stub("wan.distributed.sequence_parallel", sp_attn_forward_causal=None, sp_dit_forward_causal=None)
    _stub("wan.distributed.util", get_world_size=lambda: 1)

    import wan.modules.attention as attention_mod
    attention_mod.flash_attention = sdpa_attention
    attention_mod.attention = sdpa_attention
    import wan.modules.model as model_mod
    import wan.modules.model_fast as fast_mod
    fast_mod.flash_attention = sdpa_attention
    fast_mod.attention = sdpa_attention
    model_mod.flash_attention = sdpa_attention
    import wan.utils.cam_utils as cam_utils
    import wan.utils.fm_solvers_unipc as unipc
    import wan.image2video_fast as i2v_fast
    return types.SimpleNamespace(model=model_mod, fast=fast_mod, cam=cam_utils, unipc=unipc,
                                 i2v=i2v_fast)


# ----------------------------------------------------------------------------------------------
# Weights.
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def randomize_(model, up):
    """Overwrites every parameter in place, then rounds it to bf16 and back (upstream's init
    zeroes the head). Linear/Conv weights N(0, 1/fan_in), biases N(0, 0.02^2); LayerNorm and
    RMSNorm weights 1 + N(0, 0.1^2), LayerNorm biases N(0, 0.02^2); modulations N(0, 1/dim)."""
    done = set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if isinstance(mod, (torch.nn.Linear, torch.nn.Conv3d)) and pname == "weight":
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()))
            elif isinstance(mod, (torch.nn.Linear, torch.nn.Conv3d, torch.nn.LayerNorm)) and pname == "bias":
                p.normal_(0.0, 0.02)
            elif isinstance(mod, (torch.nn.LayerNorm, up.model.WanRMSNorm)) and pname == "weight":
                p.normal_(0.0, 0.1).add_(1.0)
            elif pname == "modulation":
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
            else:
                raise RuntimeError(f"no random init rule for parameter {full} ({type(mod)})")
            p.copy_(p.to(torch.bfloat16).float())
            done.add(full)
    names = {n for n, _ in model.named_parameters()}
    assert names == done, sorted(names ^ done)


def hub_config():
    """config.json as diffusers' save_config writes it for WanModelFast (ignore_for_config
    fields left out), plus text_dim for this reduced model (the C++ reader's one extra field)."""
    cfg = {"_class_name": "WanModelFast", "_diffusers_version": "0.35.1"}
    for k, v in CONFIG.items():
        if k not in ("qk_norm", "cross_attn_norm"):
            cfg[k] = v
    return cfg


# ----------------------------------------------------------------------------------------------
# Camera preprocessing: WanI2VFast.generate's lines for control_type 'cam', on our sizes.
# ----------------------------------------------------------------------------------------------
def camera_embedding(up, c2ws, intrinsics, io):
    from einops import rearrange
    h, w, lat_h, lat_w = PIX_H, PIX_W, LAT_H, LAT_W
    Ks = torch.from_numpy(intrinsics).float()
    Ks = up.cam.get_Ks_transformed(Ks, height_org=480, width_org=832, height_resize=h,
                                   width_resize=w, height_final=h, width_final=w)
    Ks = Ks[0]
    len_c2ws = len(c2ws)
    len_c2ws_ = int((len_c2ws - 1) // 4) + 1
    len_c2ws_ = int(len_c2ws_ - (len_c2ws_ % CHUNK))
    assert len_c2ws_ == LAT_F
    c2ws_interp = up.cam.interpolate_camera_poses(
        src_indices=np.linspace(0, len_c2ws - 1, len_c2ws), src_rot_mat=c2ws[:, :3, :3],
        src_trans_vec=c2ws[:, :3, 3], tgt_indices=np.linspace(0, len_c2ws - 1, len_c2ws_))
    io["cam.c2ws_interp"] = c2ws_interp.clone()
    rel_raw = up.cam.compute_relative_poses(c2ws_interp.clone(), framewise=True, normalize_trans=False)
    io["cam.relative_unnormalized"] = rel_raw.clone()
    c2ws_infer = up.cam.compute_relative_poses(c2ws_interp, framewise=True)
    io["cam.relative"] = c2ws_infer.clone()
    Ks = Ks.repeat(len(c2ws_infer), 1)
    io["cam.Ks"] = Ks[0].clone()
    emb = up.cam.get_plucker_embeddings(c2ws_infer, Ks, h, w, only_rays_d=False)
    io["cam.rays"] = emb[:1].clone()  # [1, h, w, 6]
    emb = rearrange(emb, "f (h c1) (w c2) c -> (f h w) (c c1 c2)", c1=int(h // lat_h), c2=int(w // lat_w))
    emb = emb[None, ...]
    emb = rearrange(emb, "b (f h w) c -> b c f h w", f=LAT_F, h=lat_h, w=lat_w).to(torch.float32)
    io["cam.plucker"] = emb[:, :, :RAY_FRAMES].clone()  # [1, 384, 3, lat_h, lat_w]
    return emb


# ----------------------------------------------------------------------------------------------
# The loop of WanI2VFast.generate, CPU and float32, noise passed in.
# ----------------------------------------------------------------------------------------------
def init_caches(model, frame_seqlen):
    hd = model.dim // model.num_heads
    kv_size = frame_seqlen * model.local_attn_size
    self_kv = [{"k": torch.zeros([1, kv_size, model.num_heads, hd]),
                "v": torch.zeros([1, kv_size, model.num_heads, hd]),
                "global_end_index": torch.tensor([0], dtype=torch.long),
                "local_end_index": torch.tensor([0], dtype=torch.long)} for _ in range(model.num_layers)]
    cross_kv = [{"k": torch.zeros([1, model.text_len, model.num_heads, hd]),
                 "v": torch.zeros([1, model.text_len, model.num_heads, hd]),
                 "is_init": torch.tensor(0, dtype=torch.int32)} for _ in range(model.num_layers)]
    return self_kv, cross_kv, kv_size


def rollout(up, model, plucker, io):
    scheduler = up.unipc.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1,
                                                     use_dynamic_shifting=False)
    scheduler.set_timesteps(1000, shift=SHIFT)
    timesteps = scheduler.timesteps[TIMESTEPS_INDEX]
    io["sched.timesteps"] = timesteps.clone()
    io["sched.table_timesteps"] = scheduler.timesteps.clone()
    io["sched.table_sigmas"] = scheduler.sigmas.clone()
    to_x0 = up.i2v.WanI2VFast._convert_flow_pred_to_x0

    noise = fixture_uniform(1, [16, LAT_F, LAT_H, LAT_W])
    img = fixture_uniform(2, [16, LAT_F, LAT_H, LAT_W])
    msk = torch.zeros(4, LAT_F, LAT_H, LAT_W)
    msk[:, 0] = 1.0
    y = torch.cat([msk, img])
    context = [fixture_uniform(3, [CONTEXT_TOKENS, CONFIG["text_dim"]])]

    frame_seqlen = LAT_H * LAT_W // 4
    self_kv, cross_kv, kv_size = init_caches(model, frame_seqlen)
    max_seq_len = CHUNK * frame_seqlen
    latents = noise.split(CHUNK, dim=1)
    conds = y.split(CHUNK, dim=1)
    cams = plucker.split(CHUNK, dim=2)
    for c in range(len(latents)):
        current = latents[c]
        kwargs = {"context": [context[0]], "seq_len": max_seq_len, "y": [conds[c]],
                  "dit_cond_dict": {"c2ws_plucker_emb": cams[c].chunk(1, dim=0)},
                  "kv_cache": self_kv, "crossattn_cache": cross_kv,
                  "current_start": c * CHUNK * frame_seqlen, "max_attention_size": kv_size}
        for s in range(len(timesteps)):
            t = torch.stack([timesteps[s]])
            flow = model(x=[current], t=t, **kwargs)[0]
            io[f"c{c}.s{s}.t"] = t.clone()
            io[f"c{c}.s{s}.x"] = current.clone()
            io[f"c{c}.s{s}.flow"] = flow.clone()
            x0 = to_x0(None, flow_pred=flow, xt=current, timestep=timesteps[s], scheduler=scheduler)
            if s < len(timesteps) - 1:
                draw = fixture_uniform(100 + 10 * c + s, [CHUNK, 16, LAT_H, LAT_W]).permute(1, 0, 2, 3)
                current = scheduler.add_noise(x0, draw.contiguous(), timesteps[s + 1])
        io[f"c{c}.x0"] = x0.clone()
        t0 = torch.stack([timesteps[-1] * 0.0])
        flow = model(x=[x0], t=t0, **kwargs)[0]
        n = len(timesteps)
        io[f"c{c}.s{n}.t"] = t0.clone()
        io[f"c{c}.s{n}.flow"] = flow.clone()
        for l, kv in enumerate(self_kv):
            g, le = int(kv["global_end_index"]), int(kv["local_end_index"])
            io[f"c{c}.kv{l}.k_sub"] = kv["k"][0, :le][::KV_TOKEN_STRIDE].clone()
            io[f"c{c}.kv{l}.v_sub"] = kv["v"][0, :le][::KV_TOKEN_STRIDE].clone()
            io[f"c{c}.kv{l}.end"] = torch.tensor([g, le], dtype=torch.int64)
    for l, kv in enumerate(cross_kv):
        io[f"cross{l}.k"] = kv["k"][0].clone()
        io[f"cross{l}.v"] = kv["v"][0].clone()
    return timesteps, scheduler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", default="/tmp/lingbot_up",
                    help="a checkout of Robbyant/lingbot-world at 91ff5f6")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    up = load_upstream(os.path.abspath(args.upstream))
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(SEED)
    with contextlib.redirect_stdout(sys.stderr):
        model = up.fast.WanModelFast(**CONFIG)
    model.eval().requires_grad_(False)
    randomize_(model, up)
    from safetensors.torch import load_file, save_file
    wpath = os.path.join(args.out, "diffusion_pytorch_model.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}, wpath)
    model.load_state_dict(load_file(wpath), strict=True)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hub_config(), f, indent=2)
        f.write("\n")

    c2ws, intrinsics = camera_path()
    io = {"cam.c2ws": torch.from_numpy(c2ws), "cam.intrinsics": torch.from_numpy(intrinsics),
          "check.uniform": fixture_uniform(7, [16])}
    plucker = camera_embedding(up, c2ws, intrinsics, io)
    timesteps, scheduler = rollout(up, model, plucker, io)
    io = {k: v.contiguous() for k, v in io.items()}
    save_file(io, os.path.join(args.out, "io.safetensors"))
    flows = [float(io[f"c{c}.s{s}.flow"].abs().max()) for c in range(LAT_F // CHUNK) for s in range(5)]
    print(f"timesteps {timesteps.tolist()}; |flow| max per call {[round(v, 2) for v in flows]}")
    for name in ("config.json", "diffusion_pytorch_model.safetensors", "io.safetensors"):
        print(f"  {name}: {os.path.getsize(os.path.join(args.out, name))} bytes")


if __name__ == "__main__":
    main()
