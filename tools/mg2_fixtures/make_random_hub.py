#!/usr/bin/env python3
"""Lays out a Matrix-Game-2.0 folder as the hub ships it, with random weights of the real shapes,
so that the programs' whole path (wm_render --model DIR/base_distilled_model --image ...) can be
run end to end where the real weights cannot be downloaded. Hand-run; nothing here is committed.

  OUT/base_distilled_model/config.json          the universal config (from --dit)
  OUT/base_distilled_model/base_distill.safetensors   model.* keys, bf16 (hard link to --dit's)
  OUT/Wan2.1_VAE.pth                            upstream's VideoVAE_(dim 96, z_dim 16), random
  OUT/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth
                                                upstream's clip_xlm_roberta_vit_h_14 visual tower
                                                (random) plus a tiny text tower and log_scale,
                                                so the file has the real file's kinds of keys

--dit names a folder with config.json and model.safetensors of the real universal shape, e.g.
what make_dit_fixtures.py --full writes. The modules are upstream's own (imported as the
fixture scripts beside this one do); the weights are saved with torch.save as the real files are.
"""
import argparse
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_clip_fixtures as clipfx  # noqa: E402
import make_vae_fixtures as vaefx  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", default="/work/upstream/Matrix-Game-2")
    ap.add_argument("--dit", required=True, help="folder with config.json + model.safetensors (real shape)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dit_dir = os.path.join(args.out, "base_distilled_model")
    os.makedirs(dit_dir, exist_ok=True)
    shutil.copyfile(os.path.join(args.dit, "config.json"), os.path.join(dit_dir, "config.json"))
    dst = os.path.join(dit_dir, "base_distill.safetensors")
    if not os.path.exists(dst):
        try:
            os.link(os.path.join(args.dit, "model.safetensors"), dst)
        except OSError:
            shutil.copyfile(os.path.join(args.dit, "model.safetensors"), dst)

    torch.manual_seed(0)
    xv, _ = vaefx.load_upstream(args.upstream)
    vae = xv.VideoVAE_(dim=96, z_dim=16).eval().requires_grad_(False)
    vaefx.randomize(vae, torch.Generator().manual_seed(1234))
    torch.save({k: v.contiguous() for k, v in vae.state_dict().items()}, os.path.join(args.out, "Wan2.1_VAE.pth"))
    del vae
    print("wrote Wan2.1_VAE.pth", flush=True)

    clip = clipfx.load_upstream_clip(args.upstream)
    model = clip.clip_xlm_roberta_vit_h_14(pretrained=False, return_transforms=False,
                                           embed_dim=32, vocab_size=64, max_text_len=16, text_dim=32,
                                           text_heads=2, text_layers=1)
    model = model.eval().requires_grad_(False)
    clipfx.randomize(model, torch.Generator().manual_seed(4321))
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()},
               os.path.join(args.out, "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"))
    print("wrote the CLIP checkpoint", flush=True)


if __name__ == "__main__":
    main()
