#!/usr/bin/env python3
"""Reference fixtures for the Wan2.1 VAE (dit/wan_vae.h, WanVaeCodec in dit/codec.h), produced by
Matrix-Game-2.0's upstream code itself.

Run by hand (never by CI):
  /work/venv/bin/python tools/mg2_fixtures/make_vae_fixtures.py \
      [--upstream /work/upstream/Matrix-Game-2] [--out tests/dit/fixtures/wan_vae]

The model: upstream's `VideoVAE_` (wan/vae/wanx_vae_src/vae.py, the class the MG2 encoder runs)
with base dim 4 instead of 96 and everything else as shipped (z_dim 16, dim_mult [1, 2, 4, 4],
2 res blocks, temporal_downsample [False, True, True], attention only in the middle blocks), so
its state dict has the real file's 194 key names (encoder.*, conv1.*, conv2.*, decoder.*). Base
dim 4 keeps the file small (dim 16 would be 14 MB). Every parameter is random and of a sensible
scale (conv weights N(0, 1/fan_in) times a gain, biases 0.05 N(0, 1), RMS gammas uniform in
[0.5, 1.5], the attention output projection non-zero although upstream initialises it to zero),
rounded to float16 and stored as float16 in the .pth (torch.save of the state dict, the way
Wan2.1_VAE.pth is saved; float16 halves the file). The references run in float32 on those
rounded values.

What runs upstream's own code (nothing re-implemented):
  * encode: upstream's `WanVAE.encode(videos, device, tiled=True, tile_size, tile_stride)`
    (wanx_vae_src/vae.py, as inference.py calls it) on the reduced `VideoVAE_`; tile size and
    stride are chosen so that, as at 352x640 with [44, 80] / [23, 38], exactly one tile with
    mask 1 covers the frame. The `WanVAE` wrapper object is assembled without its __init__,
    which would build and load the dim-96 model; its mean, std, scale and upsampling_factor are
    set as __init__ sets them. Input: MG2's condition video [image, zeros x 4 (N - 1)], N = 3
    latent frames (9 frames), the image a seeded random uint8 frame turned into [-1, 1] by
    (u8 / 255 - 0.5) / 0.5 (ToTensor + Normalize(0.5, 0.5)).
  * decode: upstream's streaming decoder `VAEDecoderWrapper` (demo_utils/vae_block3.py) with
    its `.decoder` replaced by a reduced `VAEDecoder3d(dim=4)`, the keys containing 'decoder.'
    or 'conv2' of the same state dict loaded strictly, as inference.py does; then called as
    pipeline/causal_inference.py calls it, `video, cache = vae(latents, *cache)`, starting from
    32 `None` slots, for 3 chunks of 3 latent frames (9, 12, 12 frames).
  * uint8 frames: inference.py's conversion, ((v + 1) * 127.5).clip(0, 255) then
    .numpy().astype(np.uint8) (truncation), on each chunk's [T, H, W, C] frames.

Substitution, forced by the CPU: upstream encodes in bf16 and decodes in fp16 on a GPU; the
fixtures are float32 throughout.

Sizes: frames 24x40 (latents 3x5: odd, non-square), to keep the files small.

Full-size check (--full DIR, not a fixture: files of about 0.6 GB, never committed): the real
shape (base dim 96) with random weights of the same scales (stored float32), a 352x640 image
encoded alone and 2 decode chunks of 3 latents (9 + 12 frames), through the same upstream calls,
timed; writes DIR/wan_vae.pth and DIR/io.safetensors (enc.video, enc.mu, dec.latents,
dec.latents_per_chunk, dec.frames.{0,1}, and the upstream wall and CPU times enc.ms, enc.cpu_ms,
dec.ms.{0,1}, dec.cpu_ms.{0,1}) for
`wm_bench_vae --check DIR`.

Files written:
  wan_vae_tiny.pth           the state dict (float16), keys exactly as in Wan2.1_VAE.pth
  expected.safetensors
    enc.image_u8      [24, 40, 3] uint8    the condition image
    enc.video         [1, 3, 9, 24, 40] float32   the encoder's input [image, zeros x 8]
    enc.mu            [1, 16, 3, 3, 5] float32    WanVAE.encode output (normalised mu)
    dec.latents       [1, 9, 16, 3, 5] float32    decoder input, chunk c = frames 3c..3c+2
    dec.frames.{c}    [1, F_c, 3, 24, 40] float32 VAEDecoderWrapper output of chunk c
                                                  (F = 9, 12, 12), clamped to [-1, 1]
    dec.u8.{c}        [F_c, 24, 40, 3] uint8      the same frames as inference.py writes them
    cache.{i}.sample  [n] float32   slot i (0..31) after chunk 0, flattened, every `stride`-th
                                    element from 0 (all of it when it has <= 256 elements)
    cache.{i}.meta    [6] int64     the slot's 5 dims and the stride
    cache.{i}.abs_sum [1] float64   sum of |x| over the whole slot
"""
import argparse
import importlib.util
import math
import os
import sys
import types

import numpy as np
import torch
from safetensors.torch import save_file

DIM = 4
LAT_H, LAT_W = 3, 5
N_COND = 3          # latent frames of the encoded condition
CHUNKS = 3
CHUNK_LATENTS = 3
SAMPLE = 256        # cache slot elements kept


def load_file_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_upstream(upstream):
    """wanx_vae_src/vae.py alone (its package __init__ pulls CLIP), and demo_utils/vae_block3.py
    with `wan` and `wan.modules` as empty packages (their __init__s import the T5 code, which
    touches CUDA at import)."""
    sys.path.insert(0, upstream)
    for pkg, sub in (("wan", "wan"), ("wan.modules", os.path.join("wan", "modules"))):
        m = types.ModuleType(pkg)
        m.__path__ = [os.path.join(upstream, sub)]
        sys.modules[pkg] = m
    xv = load_file_module("wanx_vae_src_vae", os.path.join(upstream, "wan", "vae", "wanx_vae_src", "vae.py"))
    vb = load_file_module("vae_block3", os.path.join(upstream, "demo_utils", "vae_block3.py"))
    return xv, vb


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p[0].numel()
                gain = 1.0
                if name.endswith("head.2.weight") and name.startswith("decoder."):
                    gain = 0.6  # frames mostly inside [-1, 1], some clamped
                p.copy_(gain * torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            p.copy_(p.half().float())  # the values the float16 file holds


def upstream_encoder(xv, model):
    """upstream's WanVAE wrapper around `model`, assembled without its __init__ (which would build
    and load the dim-96 model): mean, std, scale and upsampling_factor set as __init__ sets them."""
    wrapper = xv.WanVAE.__new__(xv.WanVAE)
    torch.nn.Module.__init__(wrapper)
    wrapper.mean = torch.tensor([-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                                 0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921])
    wrapper.std = torch.tensor([2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160])
    wrapper.scale = [wrapper.mean, 1.0 / wrapper.std]
    wrapper.model = model
    wrapper.upsampling_factor = 8
    return wrapper


def upstream_decoder(vb, dim, sd):
    """VAEDecoderWrapper with a VAEDecoder3d(dim) and the 'decoder.' / 'conv2' keys of sd loaded
    strictly, as inference.py loads them."""
    dec = vb.VAEDecoderWrapper()
    dec.decoder = vb.VAEDecoder3d(dim=dim)
    dec.load_state_dict({k: v for k, v in sd.items() if "decoder." in k or "conv2" in k})
    return dec.float().eval().requires_grad_(False)


def tile_args(lat_h, lat_w):
    """One tile covering the frame: tile = latent size, a stride that skips the second row and
    column of tiles (as [44, 80] / [23, 38] at 352x640)."""
    return dict(tiled=True, tile_size=(lat_h, lat_w), tile_stride=(max(lat_h - 1, 1), max(lat_w - 2, 1)))


def run_full(xv, vb, out_dir):
    import time
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = xv.VideoVAE_(dim=96, z_dim=16).eval().requires_grad_(False)
    randomize(model, torch.Generator().manual_seed(1234))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    torch.save(sd, os.path.join(out_dir, "wan_vae.pth"))
    gen = torch.Generator().manual_seed(42)
    out = {}
    image_u8 = torch.randint(0, 256, (352, 640, 3), generator=gen, dtype=torch.uint8)
    video = ((image_u8.permute(2, 0, 1).float() / 255.0 - 0.5) / 0.5)[None, :, None]
    wrapper = upstream_encoder(xv, model)
    with torch.no_grad():
        t0, c0 = time.perf_counter(), time.process_time()
        mu = wrapper.encode(video, device="cpu", **tile_args(44, 80))
        out["enc.ms"] = torch.tensor([1000 * (time.perf_counter() - t0)], dtype=torch.float64)
        out["enc.cpu_ms"] = torch.tensor([1000 * (time.process_time() - c0)], dtype=torch.float64)
    out["enc.video"] = video.contiguous()
    out["enc.mu"] = mu.float().contiguous()
    print("encode", tuple(mu.shape), f"{out['enc.ms'].item():.0f} ms", flush=True)
    dec = upstream_decoder(vb, 96, sd)
    del model, wrapper
    latents = torch.randn(1, 6, 16, 44, 80, generator=gen)
    out["dec.latents"] = latents
    out["dec.latents_per_chunk"] = torch.tensor([3], dtype=torch.int64)
    cache = [None] * 32
    with torch.no_grad():
        for c in range(2):
            t0, c0 = time.perf_counter(), time.process_time()
            frames, cache = dec(latents[:, 3 * c:3 * c + 3], *cache)
            out[f"dec.ms.{c}"] = torch.tensor([1000 * (time.perf_counter() - t0)], dtype=torch.float64)
            out[f"dec.cpu_ms.{c}"] = torch.tensor([1000 * (time.process_time() - c0)], dtype=torch.float64)
            out[f"dec.frames.{c}"] = frames.float().contiguous()
            print(f"decode chunk {c}", tuple(frames.shape), f"{out[f'dec.ms.{c}'].item():.0f} ms", flush=True)
    save_file(out, os.path.join(out_dir, "io.safetensors"))


def cache_entries(i, t):
    t = t.detach().float().contiguous()
    flat = t.reshape(-1)
    stride = max(1, math.ceil(flat.numel() / SAMPLE))
    return {
        f"cache.{i}.sample": flat[::stride].clone(),
        f"cache.{i}.meta": torch.tensor(list(t.shape) + [stride], dtype=torch.int64),
        f"cache.{i}.abs_sum": flat.double().abs().sum().reshape(1),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", default="/work/upstream/Matrix-Game-2")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                  "tests", "dit", "fixtures", "wan_vae"))
    ap.add_argument("--full", metavar="DIR", help="the full-size check instead (see above)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    xv, vb = load_upstream(args.upstream)
    if args.full:
        run_full(xv, vb, args.full)
        return
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    model = xv.VideoVAE_(dim=DIM, z_dim=16).eval().requires_grad_(False)
    assert model.temperal_downsample == [False, True, True]
    randomize(model, torch.Generator().manual_seed(1234))
    sd = {k: v.half().contiguous() for k, v in model.state_dict().items()}
    assert len(sd) == 194, len(sd)
    torch.save(sd, os.path.join(args.out, "wan_vae_tiny.pth"))
    sd = torch.load(os.path.join(args.out, "wan_vae_tiny.pth"), map_location="cpu")
    model.load_state_dict({k: v.float() for k, v in sd.items()})

    gen = torch.Generator().manual_seed(42)
    H, W = LAT_H * 8, LAT_W * 8
    out = {}

    # ---- encode: [image, zeros x 4 (N - 1)] through upstream's WanVAE wrapper, tiled as MG2 ----
    image_u8 = torch.randint(0, 256, (H, W, 3), generator=gen, dtype=torch.uint8)
    image = (image_u8.permute(2, 0, 1).float() / 255.0 - 0.5) / 0.5  # ToTensor + Normalize(0.5, 0.5)
    image = image[None, :, None]                                    # [1, 3, 1, H, W]
    video = torch.cat([image, torch.zeros_like(image).repeat(1, 1, 4 * (N_COND - 1), 1, 1)], dim=2)
    wrapper = upstream_encoder(xv, model)
    with torch.no_grad():
        mu = wrapper.encode(video, device="cpu", **tile_args(LAT_H, LAT_W))
        plain = model.encode(video, wrapper.scale)
    assert mu.shape == (1, 16, N_COND, LAT_H, LAT_W), mu.shape
    assert torch.equal(mu, plain), "the tiled encode is not the plain encode"
    out["enc.image_u8"] = image_u8.contiguous()
    out["enc.video"] = video.contiguous()
    out["enc.mu"] = mu.float().contiguous()
    print("encode: mu", tuple(mu.shape), "max |.|", mu.abs().max().item())

    # ---- streaming decode through VAEDecoderWrapper, 3 chunks of 3 latents ----
    dec = upstream_decoder(vb, DIM, sd)
    latents = torch.randn(1, CHUNKS * CHUNK_LATENTS, 16, LAT_H, LAT_W, generator=gen)
    out["dec.latents"] = latents.contiguous()
    cache = [None] * 32
    with torch.no_grad():
        for c in range(CHUNKS):
            z = latents[:, c * CHUNK_LATENTS:(c + 1) * CHUNK_LATENTS]
            frames, cache = dec(z, *cache)
            want = 1 + 4 * (CHUNK_LATENTS - 1) if c == 0 else 4 * CHUNK_LATENTS
            assert frames.shape == (1, want, 3, H, W), frames.shape
            out[f"dec.frames.{c}"] = frames.float().contiguous()
            thwc = frames.permute(0, 1, 3, 4, 2)  # B T H W C, as inference.py's rearrange
            u8 = ((thwc.float() + 1) * 127.5).clip(0, 255).cpu().numpy().astype(np.uint8)[0]
            out[f"dec.u8.{c}"] = torch.from_numpy(np.ascontiguousarray(u8))
            clamped = ((frames.abs() >= 1.0).float().mean().item())
            print(f"chunk {c}: frames {tuple(frames.shape)}, std {frames.std().item():.3f}, "
                  f"clamped {100 * clamped:.1f}%")
            if c == 0:
                assert len(cache) == 32 and all(isinstance(t, torch.Tensor) for t in cache)
                for i, t in enumerate(cache):
                    out.update(cache_entries(i, t))

    save_file(out, os.path.join(args.out, "expected.safetensors"))
    for f in sorted(os.listdir(args.out)):
        print(f, os.path.getsize(os.path.join(args.out, f)))


if __name__ == "__main__":
    main()
