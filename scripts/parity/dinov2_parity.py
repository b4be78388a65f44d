#!/usr/bin/env python
"""Numerical parity of dit_trainer's DINOv2 encoders with facebookresearch/dinov2's vision transformer.

Usage: python scripts/parity/dinov2_parity.py --reference /path/to/dinov2-checkout
           [--weights FILE --model dinov2_vitb14]

The checkout's `dinov2` package is imported from there, never copied (it needs only torch; xformers
is disabled so its attention is the plain scaled_dot_product_attention path every user without
xformers runs). The reference models are built as its torch-hub entry points build them
(`dinov2.hub.backbones`, pretrained=False: 518 px position embedding, layer scale, no block chunks,
the offset/antialias conventions of the models with and without registers). Without --weights every
parameter of the reference (layer scales, norms, tokens and position embedding included) is given
random O(1)-output values, which are copied into ours with load_state_dict(strict=True), checking
every name and shape; with --weights both load the same official checkpoint, ours through
build_encoder (the loader under test). ViT-g is checked at reduced width and depth (its SwiGLU FFN,
registers and conventions unchanged): the full model's 1.1 B parameters twice would need 9 GB.

Rows (float32, CPU, one thread), each relative max difference max|ours − ref| / max|ref| of
forward_features' keys, and max|ours − ref| in the note: at 518 px (the stored grid, no resampling),
224 px (position embedding resampled 37 → 16) and a 224×168 non-square input; and for ViT-S the
same at 224 px under CPU bf16 autocast (group "autocast": the residual stream's dtype must follow
dinov2's promotions). Bound 1e-5.

Exit status: 0 when every row passes, 1 when any fails, 2 when the reference cannot be imported.
"""

import argparse
import importlib
import math
import os
import sys
import time

import torch
from common import Table, load_or_report, rel_diff

BOUNDS = {"tokens": 1e-5, "autocast": 1e-5}
KEYS = ("x_norm_patchtokens", "x_norm_clstoken", "x_norm_regtokens", "x_prenorm")
# (our name, overrides of our shape, the reference's entry point, its extra kwargs, sizes (H, W))
CASES = [
    ("dinov2_vits14", {}, "dinov2_vits14", {}, [(518, 518), (224, 224), (224, 168)]),
    ("dinov2_vits14_reg", {}, "dinov2_vits14_reg", {}, [(518, 518), (224, 224), (224, 168)]),
    ("dinov2_vitb14", {}, "dinov2_vitb14", {}, [(224, 224)]),
    ("dinov2_vitb14_reg", {}, "dinov2_vitb14_reg", {}, [(224, 224)]),
    ("dinov2_vitg14", {"embed_dim": 192, "depth": 3, "num_heads": 3}, None, {}, [(224, 224), (112, 140)]),
    ("dinov2_vitg14_reg", {"embed_dim": 192, "depth": 3, "num_heads": 3}, None, {}, [(224, 224), (112, 140)]),
]


def parse_args(argv=None):
    """--reference DIR, and optionally --weights FILE with --model NAME."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, metavar="DIR", help="checkout of facebookresearch/dinov2")
    parser.add_argument("--weights", metavar="FILE", help="an official torch-hub checkpoint, e.g. dinov2_vitb14_pretrain.pth")
    parser.add_argument("--model", default="dinov2_vitb14", help="the encoder --weights belong to")
    return parser.parse_args(argv)


def import_dinov2(reference):
    """dinov2.hub.backbones and dinov2.models.vision_transformer from the checkout, never from elsewhere."""
    os.environ["XFORMERS_DISABLED"] = "1"
    if not os.path.isfile(os.path.join(reference, "dinov2", "hub", "backbones.py")):
        raise FileNotFoundError(f"{os.path.join(reference, 'dinov2', 'hub', 'backbones.py')} does not exist")
    if "dinov2" in sys.modules:
        raise RuntimeError("a module named 'dinov2' is already imported; cannot import the reference's")
    sys.path.insert(0, os.path.abspath(reference))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its "xFormers is disabled" notes
        backbones = importlib.import_module("dinov2.hub.backbones")
        vits = importlib.import_module("dinov2.models.vision_transformer")
    for mod in (backbones, vits):
        if not os.path.abspath(mod.__file__).startswith(os.path.abspath(reference) + os.sep):
            raise RuntimeError(f"{mod.__name__} was imported from {mod.__file__}, not from {reference}")
    return backbones, vits


def reference_model(backbones, vits, name, overrides):
    """The reference as its hub entry point builds it, or (reduced sizes) its DinoVisionTransformer with the same options."""
    if not overrides:
        return getattr(backbones, name)(pretrained=False)
    from dit_trainer.encoders import shape_of

    shape = shape_of(name, **overrides)
    return vits.DinoVisionTransformer(
        img_size=shape.img_size, patch_size=shape.patch_size, embed_dim=shape.embed_dim, depth=shape.depth,
        num_heads=shape.num_heads, mlp_ratio=shape.mlp_ratio, init_values=1.0, block_chunks=0,
        ffn_layer="swiglufused" if shape.swiglu else "mlp", num_register_tokens=shape.num_register_tokens,
        interpolate_antialias=shape.interpolate_antialias, interpolate_offset=shape.interpolate_offset)


@torch.no_grad()
def randomise_(model, seed):
    """Every parameter random with O(1) outputs: matrices scaled by fan-in, vectors and tokens around their init."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if p.dim() >= 2 and not name.endswith(("token", "tokens", "pos_embed")):
            p.copy_(noise / math.sqrt(p[0].numel()))
        elif name.endswith((".gamma", "norm1.weight", "norm2.weight", "norm.weight")):
            p.copy_(1 + 0.2 * noise)
        else:
            p.copy_(0.5 * noise)


def compare(table, ours, ref, tag, sizes, seed, autocast=False):
    """One row per forward_features key and input size (under CPU bf16 autocast when `autocast`)."""
    g = torch.Generator().manual_seed(seed)
    for h, w in sizes:
        x = torch.randn(2, 3, h, w, generator=g)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            a, b = ours.forward_features(x), ref.forward_features(x)
        for key in KEYS:
            if key == "x_norm_regtokens" and ours.num_register_tokens == 0:
                continue
            diff = (a[key] - b[key]).abs().max().item()
            group = "autocast" if autocast else "tokens"
            table.add(group, f"{tag} {h}x{w}: {key}", rel_diff(a[key], b[key]), f"max|diff| {diff:.1e}")


def main(argv=None):
    """Compare, print the table and return the exit status."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    refs = load_or_report(lambda: import_dinov2(args.reference), args.reference)
    if refs is None:
        return 2
    backbones, vits = refs
    from dit_trainer.encoders import build_encoder

    print(f"torch {torch.__version__}, float32, 1 thread; reference {args.reference} (xformers disabled)")
    start, table = time.time(), Table(BOUNDS)
    if args.weights:
        ref = getattr(backbones, args.model)(pretrained=False).eval()
        ref.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True), strict=True)
        ours = build_encoder(args.model, weights=args.weights)
        compare(table, ours, ref, f"{args.model} ({os.path.basename(args.weights)})", [(518, 518), (224, 224)], 0)
    else:
        for seed, (name, overrides, _, _, sizes) in enumerate(CASES):
            ref = reference_model(backbones, vits, name, overrides).eval()
            randomise_(ref, seed)
            ours = build_encoder(name, **overrides)
            ours.load_state_dict(ref.state_dict(), strict=True)
            tag = name + (" (" + ", ".join(f"{k} {v}" for k, v in overrides.items()) + ")" if overrides else "")
            compare(table, ours, ref, tag, sizes, 100 + seed)
            if not overrides and "vits" in name:
                compare(table, ours, ref, tag, [(224, 224)], 200 + seed, autocast=True)
    return table.report(time.time() - start)


if __name__ == "__main__":
    sys.exit(main())
