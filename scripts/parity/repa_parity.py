#!/usr/bin/env python
"""Numerical parity of dit_trainer's REPA projector, aligned tokens and alignment loss with the
sihyun-yu/REPA release.

Usage: python scripts/parity/repa_parity.py --reference /path/to/REPA-checkout [--timm-shim DIR]

The checkout must hold the release's `models/sit.py` and `loss.py`; both are imported from there by
file path, never copied. `models/sit.py` imports `timm.models.vision_transformer`; without
--timm-shim the script registers common.py's stand-in (PatchEmbed, Attention, Mlp with timm's
names, attention written out as softmax(q·kᵀ/√d)·v).

Rows (relative max difference max|ours − ref| / max|ref|, float32, CPU, one thread):
  projector  < 1e-5  the release's `build_mlp` and our projector with the same random weights, on
                     random tokens
  model      < 1e-4  a small SiT (depth 4, width 64, aligned block 2) of the release and ours with the
                     same weights (the release's `projectors.0.*` are our `repa_projector.*`): the
                     velocity output and the projected tokens of the aligned block
  loss       < 1e-5  the release's `SILoss` projection term (its draws of t and noise from the global
                     RNG, its model call) against our `alignment_loss` on our model's projected tokens
                     for the same network input, with the same encoder tokens

Exit status: 0 when every row passes, 1 when any fails, 2 when the reference cannot be imported.
"""

import importlib.util
import os
import sys

import torch
from common import Table, install_timm_stand_in, load_or_report, parse_args, randomise_, rel_diff

BOUNDS = {"projector": 1e-5, "model": 1e-4, "loss": 1e-5}
DEPTH, WIDTH, HEADS, ALIGNED, Z_DIM, PROJ = 4, 64, 4, 2, 32, 48


def _load(reference, relpath, name):
    path = os.path.join(reference, relpath)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_reference(reference, timm_shim):
    """The release's models/sit.py and loss.py as modules (timm from the shim or the stand-in)."""
    if timm_shim:
        sys.path.insert(0, os.path.abspath(timm_shim))
    else:
        install_timm_stand_in()
    return _load(reference, os.path.join("models", "sit.py"), "repa_release_sit"), _load(reference, "loss.py",
                                                                                          "repa_release_loss")


def our_model():
    """Our SiT with REPA's projector at the parity sizes."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    cfg = build_config({
        "model": {"name": "SiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10, "learn_sigma": False,
                  "depth": DEPTH, "hidden_size": WIDTH, "num_heads": HEADS},
        "repa": {"enabled": True, "encoder_depth": ALIGNED, "projector_dim": PROJ, "encoder_weights": "random",
                 "encoder_overrides": {"embed_dim": Z_DIM, "num_heads": 2}},
    })
    return get_spec("SiT-S/2").build_model_fn(cfg)


def to_release(state):
    """Our state dict in the release's names: `repa_projector.*` is its `projectors.0.*`."""
    return {("projectors.0." + k[len("repa_projector."):] if k.startswith("repa_projector.") else k): v
            for k, v in state.items()}


def check_projector(table, sit):
    from dit_trainer.repa.projector import build_projector

    ref = sit.build_mlp(WIDTH, PROJ, Z_DIM)
    ours = build_projector(WIDTH, PROJ, Z_DIM)
    randomise_(ours, 1)
    ref.load_state_dict(ours.state_dict(), strict=True)
    tokens = torch.randn(3, 16, WIDTH, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        table.add("projector", "build_mlp vs ours, 3x16 tokens", rel_diff(ours(tokens), ref(tokens.reshape(-1, WIDTH)).reshape(3, 16, -1)))


def paired_models(table, sit):
    ours = our_model()
    randomise_(ours, 3)
    ref = sit.SiT(input_size=8, patch_size=2, in_channels=4, hidden_size=WIDTH, decoder_hidden_size=WIDTH,
                  encoder_depth=ALIGNED, depth=DEPTH, num_heads=HEADS, num_classes=10, z_dims=[Z_DIM],
                  projector_dim=PROJ, qk_norm=False, fused_attn=False)
    missing = ref.load_state_dict(to_release(ours.state_dict()), strict=False)
    if missing.missing_keys or missing.unexpected_keys:
        table.fail("model", "state dict names", f"missing {missing.missing_keys[:3]}, unexpected {missing.unexpected_keys[:3]}")
        return None, None
    return ours.eval(), ref.eval()


def check_model(table, ours, ref):
    g = torch.Generator().manual_seed(4)
    x, t, y = torch.randn(4, 4, 8, 8, generator=g), torch.rand(4, generator=g), torch.tensor([0, 3, 9, 10])
    with torch.no_grad():
        out, projected = ours(x, t, y, repa=True)
        ref_out, zs = ref(x, t, y)
    table.add("model", "velocity output", rel_diff(out, ref_out))
    table.add("model", f"projected tokens of block {ALIGNED}", rel_diff(projected, zs[0]))


def check_loss(table, loss_module, ours, ref):
    from dit_trainer.repa.projector import alignment_loss

    g = torch.Generator().manual_seed(5)
    images = torch.randn(6, 4, 8, 8, generator=g)
    y = torch.randint(0, 10, (6,), generator=g)
    target = torch.randn(6, 16, Z_DIM, generator=g)  # the encoder's patch tokens of the clean images
    seen = {}

    def model(x, t, **kwargs):
        seen["x"], seen["t"] = x, t
        return ref(x, t, **kwargs)

    torch.manual_seed(6)
    with torch.no_grad():
        _, proj_loss = loss_module.SILoss(prediction="v", path_type="linear", weighting="uniform")(
            model, images, {"y": y}, zs=[target])
        _, projected = ours(seen["x"], seen["t"], y, repa=True)
    table.add("loss", "SILoss proj_loss vs alignment_loss mean", rel_diff(alignment_loss(projected, target).mean(), proj_loss))


def main(argv=None) -> int:
    args = parse_args(__doc__, "a checkout of github.com/sihyun-yu/REPA", argv=argv)
    torch.set_num_threads(1)
    loaded = load_or_report(lambda: load_reference(args.reference, args.timm_shim), args.reference)
    if loaded is None:
        return 2
    sit, loss_module = loaded
    table = Table(BOUNDS)
    check_projector(table, sit)
    ours, ref = paired_models(table, sit)
    if ours is not None:
        check_model(table, ours, ref)
        check_loss(table, loss_module, ours, ref)
    print(table.render())
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
