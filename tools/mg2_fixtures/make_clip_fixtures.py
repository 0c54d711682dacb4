#!/usr/bin/env python3
"""Reference fixtures for the CLIP vision tower (dit/clip_vision.h) and Matrix-Game-2.0's
conditioning-image preprocessing (dit/mg2_image.h), produced by the upstream code itself.

Run by hand (never by CI):
  /work/venv/bin/python tools/mg2_fixtures/make_clip_fixtures.py \
      [--upstream /work/upstream/Matrix-Game-2] [--out tests/dit/fixtures/clip]

What runs upstream's own code:
  * the CLIP model is built by upstream's `clip_xlm_roberta_vit_h_14` (wan/vae/wanx_vae_src/clip.py)
    with reduced sizes (vision dim 64, 4 blocks, 4 heads, mlp 256, image 224, patch 14; a tiny
    text tower), so its state dict carries the real file's key names (visual.*, textual.*,
    log_scale);
  * the crop is inference.py's `InteractiveGameInference._resizecrop` and the 352x640 transform
    is the `frame_process` Compose of its __init__, both taken from the source file with `ast`
    (inference.py itself imports the whole pipeline);
  * the CLIP input and the tokens come from upstream's `CLIPModel.encode_video`.

Two substitutions, both forced by running on the CPU in float32:
  * upstream's `flash_attention` asserts CUDA and computes in bf16; it is replaced by exact
    float32 softmax attention (scale 1/sqrt(head_dim)), the tower's definition in float32;
  * inference.py casts the 352x640 image to bf16 before `encode_video`; the fixture keeps float32.

Made with torch 2.15, torchvision 0.29.2 and Pillow 13.0.0. Pillow 13 chose a new order for
the two passes of a resize (vertical first when the height shrinks and the width shrinks by
less than half as many pixels); dit/mg2_image.h follows it by default and offers the older
horizontal-first order.

Weights: random, of sensible scale for every parameter (norm weights 1 + 0.1 N(0,1), biases
0.05 N(0,1), ...), rounded to float16 and stored as float16 in the .pth (torch.save of the whole
model's state dict, as the real `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth` is
saved; float16 halves the file). The reference runs in float32 on those rounded values.

Files written:
  clip_tiny.pth           whole-CLIP state dict (float16)
  image_{a,b}.png         synthetic source images, 601x401 and 1000x500
  image_{a,b}_352.png     upstream's 352x640 image as uint8 (the float tensor is checked to be
                          exactly (u8 / 255 - 0.5) / 0.5, so the PNG holds it losslessly)
  expected.safetensors    tokens_{a,b} [1, 257, 64] float32 (visual(x, use_31_block=True));
                          clip_in_{a,b}_sub [1, 3, 32, 32] float32: the 224x224 CLIP input at
                          rows and columns 0, 7, ..., 217;
                          pil_<i>_{src,dst,dst_hfirst} uint8 [h, w, 3]: PIL's BILINEAR resize of
                          noise images (PIL_CASES), and the horizontal-pass-first result

Full-size check (--full DIR, not a fixture: nothing in DIR is committed): loads the random-weight
checkpoint of the real shape that make_random_hub.py wrote (--weights, float32 values rounded to
float16) into upstream's `clip_xlm_roberta_vit_h_14` with the vision tower at its real size and
make_random_hub.py's tiny text tower, makes image_a's 224x224 CLIP input through the same upstream
preprocessing as above (the 352x640 image, then `CLIPModel.encode_video`'s own steps, stopped where
it calls the tower), and times one `visual(x, use_31_block=True)` in float32 (--threads, default 2,
exact attention). Writes DIR/io.safetensors: pixels [1, 3, 224, 224] float32, tokens
[1, 257, 1280] float32, ms and cpu_ms (float64 [1]: wall and process CPU time of the forward).
Checked by `wm_bench_clip --check DIR --weights FILE` (tools/bench_clip/README.md).
"""
import argparse
import ast
import math
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file
from torchvision.transforms import v2

SUB = 7  # stride of the stored CLIP-input subsample
# (w, h, out_w, out_h) of the resize-only cases (pil_<i>_{src,dst,dst_hfirst}).
PIL_CASES = [(31, 17, 11, 29), (40, 60, 38, 20), (90, 50, 25, 14), (13, 9, 40, 33),
             (50, 40, 50, 13), (64, 30, 20, 30), (41, 23, 42, 22), (30, 41, 29, 20)]


def load_upstream_clip(upstream):
    """Imports wan/vae/wanx_vae_src/clip.py alone (its package __init__ pulls the VAE, and
    its tokenizer module needs ftfy/transformers, neither used by the vision tower)."""
    src = os.path.join(upstream, "wan", "vae", "wanx_vae_src")
    pkg = types.ModuleType("wanx_vae_src")
    pkg.__path__ = [src]
    sys.modules["wanx_vae_src"] = pkg
    tok = types.ModuleType("wanx_vae_src.tokenizers")
    tok.HuggingfaceTokenizer = object
    sys.modules["wanx_vae_src.tokenizers"] = tok
    import importlib
    return importlib.import_module("wanx_vae_src.clip")


def exact_attention(q, k, v, dropout_p=0.0, causal=False, version=None, **_):
    """float32 stand-in for upstream's flash_attention: q, k, v [B, L, N, D] -> [B, L, N, D]."""
    assert dropout_p == 0.0 and not causal
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).contiguous()


def upstream_inference_parts(upstream):
    """(_resizecrop, frame_process) from inference.py's InteractiveGameInference."""
    path = os.path.join(upstream, "inference.py")
    tree = ast.parse(open(path).read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InteractiveGameInference")
    fns = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    ns = {"v2": v2, "torch": torch}
    mod = ast.Module(body=[fns["_resizecrop"]], type_ignores=[])
    exec(compile(mod, path, "exec"), ns)
    assign = next(s for s in fns["__init__"].body
                  if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "self.frame_process")
    frame_process = eval(compile(ast.Expression(assign.value), path, "eval"), ns)
    return ns["_resizecrop"], frame_process


def make_image(kind):
    """Deterministic synthetic RGB images: gradients, rings, a fine checkerboard and stripes
    (edges and high frequencies for the antialiased resize; flat and linear areas keep the PNGs
    small)."""
    w, h = (601, 401) if kind == "a" else (1000, 500)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255.0 * x / (w - 1)
    g = 255.0 * y / (h - 1)
    ring = ((np.hypot(x - 0.4 * w, y - 0.55 * h) // 17) % 2) * 180.0 + 30.0
    checker = (((x // 4) + (y // 4)) % 2) * 200.0
    b = np.where((x > 0.7 * w) & (y < 0.5 * h), checker, ring)
    if kind == "b":
        r = 255.0 - r * 0.8
        g = np.where(x < 0.2 * w, ((x // 2) % 2) * 230.0, g)
    rgb = np.stack([r, g, b], axis=-1)
    return Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8), "RGB")


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith("cls_embedding") or name.endswith("pos_embedding"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            else:
                p.copy_(torch.randn(p.shape, generator=gen))
            p.copy_(p.half().float())  # the values the float16 file holds


class _Stop(Exception):
    """Raised by a forward pre-hook to stop a call once the tower's input is captured."""


def run_full(clip, upstream, weights, out_dir):
    import time
    os.makedirs(out_dir, exist_ok=True)
    resizecrop, frame_process = upstream_inference_parts(upstream)
    # Built on the meta device, then the file's tensors are taken as they are (no random init of
    # 2.5 GB that the load would overwrite). Text sizes as make_random_hub.py wrote them.
    model, transforms = clip.clip_xlm_roberta_vit_h_14(
        pretrained=False, return_transforms=True, device="meta",
        embed_dim=32, vocab_size=64, max_text_len=16, text_dim=32, text_heads=2, text_layers=1)
    sd = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True, assign=True)
    model = model.eval().requires_grad_(False)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.device.type == "cpu" and t.dtype == torch.float32, (name, t.device, t.dtype)

    wrapper = clip.CLIPModel.__new__(clip.CLIPModel)
    torch.nn.Module.__init__(wrapper)
    wrapper.model = model
    wrapper.transforms = transforms
    captured = {}

    def stop(m, a, kw):
        captured["x"] = a[0].clone()
        raise _Stop

    hook = model.visual.register_forward_pre_hook(stop, with_kwargs=True)
    x352 = frame_process(resizecrop(None, make_image("a"), 352, 640))
    try:
        with torch.no_grad():
            wrapper.encode_video(x352[None, :, None].clone())
    except _Stop:
        pass
    hook.remove()
    pixels = captured["x"].float().contiguous()
    assert pixels.shape == (1, 3, 224, 224), pixels.shape

    with torch.no_grad():
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = model.visual(pixels, use_31_block=True)
        ms = 1000 * (time.perf_counter() - t0)
        cpu_ms = 1000 * (time.process_time() - c0)
    assert tokens.shape == (1, 257, 1280) and tokens.dtype == torch.float32, (tokens.shape, tokens.dtype)
    save_file({"pixels": pixels, "tokens": tokens.contiguous(),
               "ms": torch.tensor([ms], dtype=torch.float64),
               "cpu_ms": torch.tensor([cpu_ms], dtype=torch.float64)},
              os.path.join(out_dir, "io.safetensors"))
    print(f"visual(x, use_31_block=True) {tuple(tokens.shape)}: {ms:.0f} ms wall, {cpu_ms:.0f} ms CPU, "
          f"{torch.get_num_threads()} threads; max |tokens| {tokens.abs().max().item():.4g}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", default="/work/upstream/Matrix-Game-2")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                  "tests", "dit", "fixtures", "clip"))
    ap.add_argument("--full", metavar="DIR", help="the full-size check instead (see above)")
    ap.add_argument("--weights", default="/work/mg2_hub/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth",
                    help="--full: the whole-CLIP .pth of the real shape (make_random_hub.py)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 1; 2 with --full)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or (2 if args.full else 1))

    clip = load_upstream_clip(args.upstream)
    clip.flash_attention = exact_attention
    if args.full:
        run_full(clip, args.upstream, args.weights, args.full)
        return
    os.makedirs(args.out, exist_ok=True)
    resizecrop, frame_process = upstream_inference_parts(args.upstream)

    torch.manual_seed(0)
    model, transforms = clip.clip_xlm_roberta_vit_h_14(
        pretrained=False, return_transforms=True,
        vision_dim=64, vision_heads=4, vision_layers=4, embed_dim=32,
        vocab_size=64, max_text_len=16, text_dim=32, text_heads=2, text_layers=1)
    model = model.eval().requires_grad_(False)
    randomize(model, torch.Generator().manual_seed(1234))
    sd = {k: v.half().contiguous() for k, v in model.state_dict().items()}
    torch.save(sd, os.path.join(args.out, "clip_tiny.pth"))

    # upstream's CLIPModel wrapper around the model, without its checkpoint/tokenizer loading
    wrapper = clip.CLIPModel.__new__(clip.CLIPModel)
    torch.nn.Module.__init__(wrapper)
    wrapper.model = model
    wrapper.transforms = transforms
    captured = {}
    model.visual.register_forward_pre_hook(lambda m, a, kw: captured.update(x=a[0].clone()),
                                           with_kwargs=True)

    expected = {}
    for kind in ("a", "b"):
        img = make_image(kind)
        img.save(os.path.join(args.out, f"image_{kind}.png"), optimize=True)
        img = Image.open(os.path.join(args.out, f"image_{kind}.png")).convert("RGB")
        cropped = resizecrop(None, img, 352, 640)
        x352 = frame_process(cropped)  # [3, 352, 640] float32 in [-1, 1]
        assert x352.shape == (3, 352, 640) and x352.dtype == torch.float32
        u8 = torch.round((x352 * 0.5 + 0.5) * 255.0).clamp(0, 255).to(torch.uint8)
        f32 = np.float32
        back = (u8.numpy().astype(f32) / f32(255) - f32(0.5)) / f32(0.5)  # IEEE float32 steps
        assert np.array_equal(back, x352.numpy()), "352x640 tensor is not (u8/255-0.5)/0.5"
        Image.fromarray(u8.permute(1, 2, 0).numpy(), "RGB").save(
            os.path.join(args.out, f"image_{kind}_352.png"), optimize=True)

        video = x352[None, :, None].clone()  # [1, 3, 1, 352, 640] as inference.py passes it
        with torch.no_grad():
            tokens = wrapper.encode_video(video)
        assert tokens.shape == (1, 257, 64), tokens.shape
        x224 = captured["x"]
        assert x224.shape == (1, 3, 224, 224)
        expected[f"tokens_{kind}"] = tokens.float().contiguous()
        expected[f"clip_in_{kind}_sub"] = x224[:, :, ::SUB, ::SUB].contiguous()
        print(kind, "crop", cropped.size, "tokens max |.|", tokens.abs().max().item(),
              "clip input range", x224.min().item(), x224.max().item())

    # PIL's bilinear resize alone on small noise images (every pixel a rounding test): upscale,
    # strong and mild reductions, one-axis resizes, and sizes where Pillow 13 runs the vertical
    # pass first; for those the horizontal-first result (Pillow <= 12) is stored too, made by two
    # one-axis resizes (each pass rounds to uint8, as inside one resize).
    rng = np.random.default_rng(7)
    for i, (w, h, ow, oh) in enumerate(PIL_CASES):
        src = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        expected[f"pil_{i}_src"] = torch.from_numpy(np.asarray(src).copy())
        expected[f"pil_{i}_dst"] = torch.from_numpy(np.asarray(src.resize((ow, oh), Image.BILINEAR)).copy())
        hfirst = src.resize((ow, h), Image.BILINEAR).resize((ow, oh), Image.BILINEAR)
        expected[f"pil_{i}_dst_hfirst"] = torch.from_numpy(np.asarray(hfirst).copy())

    save_file(expected, os.path.join(args.out, "expected.safetensors"))
    for f in sorted(os.listdir(args.out)):
        print(f, os.path.getsize(os.path.join(args.out, f)))


if __name__ == "__main__":
    main()
