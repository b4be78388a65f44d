#!/usr/bin/env python
"""Numerical parity of dit_trainer's SiT model and transport with the willisma/SiT release.

Usage: python scripts/parity/sit.py --reference /path/to/SiT-checkout [--timm-shim DIR]

The checkout must hold the release's `models.py` and `transport/` package (which needs
torchdiffeq); both are imported from there, never copied. The release's `models.py` imports
`timm.models.vision_transformer`; without --timm-shim (a folder holding a stand-in `timm` package
put first on sys.path) the script registers common.py's stand-in in sys.modules: PatchEmbed, Attention
and Mlp with timm's attribute names, the attention written out as softmax(q·kᵀ/√d)·v, so that our
layers (which call scaled_dot_product_attention) are not compared with themselves.

Rows (relative max difference max|ours − ref| / max|ref|, float32, CPU, one thread):
  model  < 1e-4  SiT-S/2 (input 32, learned σ and not): weights copied ours → release → ours with
                 strict=True; forward and forward_with_cfg (release's three channels) at scale 4
  loss   < 1e-5  training loss of every path × prediction × weighting: the release draws x0 then t
                 from the global RNG; ours gets the same x0 and t as arguments
  ode    < 1e-4  Euler and midpoint ODE samples (every state) for Linear, GVP, VP × velocity,
                 score, noise with a small random SiT and shared initial noise; plus a guided run
                 through forward_with_cfg and a reverse (data → noise) run
  sde    < 1e-4  Euler and Heun SDE samples (last step Mean), global RNG seeded alike

Exit status: 0 when every row passes, 1 when any fails, 2 when the reference cannot be imported.
"""

import sys
import time

import torch
from common import Table, import_reference, load_or_report, parse_args, randomise_, rel_diff, share_weights

BOUNDS = {"model": 1e-4, "loss": 1e-5, "ode": 1e-4, "sde": 1e-4}


def pair(ours_ctor, ref_ctor, seed, scale=1.0, **kw):
    """Our model and the release's with the same weights, copied both ways with strict=True."""
    ours, ref = ours_ctor(**kw), ref_ctor(**kw)
    randomise_(ours, seed, scale)
    share_weights(ours, ref)
    return ours.eval(), ref.eval()


def check_models(table, ref_models):
    """Forward and forward_with_cfg of SiT-S/2, learned and fixed sigma."""
    from dit_trainer.models import SiT_models

    for learn_sigma in (True, False):
        tag = f"SiT-S/2 in32 {'learnedσ' if learn_sigma else 'fixedσ'}"
        ours, ref = pair(SiT_models["SiT-S/2"], ref_models.SiT_models["SiT-S/2"], 0,
                         input_size=32, learn_sigma=learn_sigma)
        g = torch.Generator().manual_seed(1)
        x, t = torch.randn(4, 4, 32, 32, generator=g), torch.rand(4, generator=g)
        y = torch.tensor([3, 999, 1000, 7])
        with torch.no_grad():
            table.add("model", f"{tag}: forward", rel_diff(ours(x, t, y), ref(x, t, y)))
            x2, t2, y2 = torch.cat([x[:2], x[:2]]), torch.cat([t[:2], t[:2]]), torch.tensor([3, 7, 1000, 1000])
            table.add("model", f"{tag}: forward_with_cfg (3 channels)",
                      rel_diff(ours.forward_with_cfg(x2, t2, y2, 4.0), ref.forward_with_cfg(x2, t2, y2, 4.0)))


COMBOS = [(p, q) for p in ("Linear", "GVP", "VP") for q in ("velocity", "score", "noise")]


def check_losses(table, ref_transport):
    """The training loss of every path x prediction x weighting, on the same x0 and t."""
    from dit_trainer.transport import create_transport

    def model(x, t):
        return torch.tanh(x) * 0.7 + t.view(-1, 1, 1, 1)

    x1 = torch.randn(16, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    for path_type, prediction in COMBOS:
        for weight in ((None,) if prediction == "velocity" else (None, "velocity", "likelihood")):
            ref = ref_transport.create_transport(path_type, prediction, weight, None, None)
            ours = create_transport(path_type, prediction, weight)
            torch.manual_seed(3)
            ref_loss = ref.training_losses(model, x1)["loss"]
            torch.manual_seed(3)  # the release draws x0 = randn_like(x1), then t = rand(B) on its interval
            x0 = torch.randn_like(x1)
            t0, t1 = ours.train_interval()
            t = torch.rand((x1.shape[0],)) * (t1 - t0) + t0
            table.add("loss", f"{path_type} {prediction} weight={weight}",
                      rel_diff(ours.training_losses(model, x1, t, x0)["loss"], ref_loss))


def check_samplers(table, ref_models, ref_transport):
    """ODE and SDE samples, every state, with a small random SiT and shared initial noise."""
    from dit_trainer.models import SiT_models
    from dit_trainer.transport import Sampler, create_transport

    kw = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4, num_classes=10)
    ours_model, ref_model = pair(lambda **k: SiT_models["SiT-S/2"](**k), lambda **k: ref_models.SiT(**k), 4,
                                 scale=0.5, **kw)
    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(4, 4, 8, 8, generator=g), torch.tensor([1, 2, 3, 4])
    with torch.no_grad():
        for path_type, prediction in COMBOS:
            ours_s = Sampler(create_transport(path_type, prediction))
            ref_s = ref_transport.Sampler(ref_transport.create_transport(path_type, prediction, None, None, None))
            for method in ("euler", "midpoint"):
                a = ours_s.sample_ode(sampling_method=method, num_steps=20)(z, ours_model, y=y)
                b = ref_s.sample_ode(sampling_method=method, num_steps=20)(z, ref_model, y=y)
                table.add("ode", f"{path_type} {prediction} {method}, 20 steps, every state", rel_diff(a, b))
        ours_s = Sampler(create_transport("Linear", "velocity"))
        ref_s = ref_transport.Sampler(ref_transport.create_transport("Linear", "velocity", None, None, None))
        zz, yy = torch.cat([z[:2], z[:2]]), torch.tensor([1, 2, 10, 10])
        a = ours_s.sample_ode(sampling_method="euler", num_steps=20)(zz, ours_model.forward_with_cfg, y=yy, cfg_scale=4.0)
        b = ref_s.sample_ode(sampling_method="euler", num_steps=20)(zz, ref_model.forward_with_cfg, y=yy, cfg_scale=4.0)
        table.add("ode", "Linear velocity euler cfg=4 (forward_with_cfg)", rel_diff(a, b))
        a = ours_s.sample_ode(sampling_method="midpoint", num_steps=20, reverse=True)(z, ours_model, y=y)
        b = ref_s.sample_ode(sampling_method="midpoint", num_steps=20, reverse=True)(z, ref_model, y=y)
        table.add("ode", "Linear velocity midpoint reverse", rel_diff(a, b))
        for path_type, prediction in (("Linear", "velocity"), ("GVP", "score"), ("VP", "noise")):
            for method in ("Euler", "Heun"):
                ours_s = Sampler(create_transport(path_type, prediction))
                ref_s = ref_transport.Sampler(ref_transport.create_transport(path_type, prediction, None, None, None))
                opts = dict(sampling_method=method, diffusion_form="sigma", last_step="Mean", num_steps=20)
                torch.manual_seed(6)
                a = torch.stack(ours_s.sample_sde(**opts)(z, ours_model, y=y))
                torch.manual_seed(6)
                b = torch.stack(ref_s.sample_sde(**opts)(z, ref_model, y=y))
                table.add("sde", f"{path_type} {prediction} {method} sigma Mean, 20 steps", rel_diff(a, b))


def main(argv=None):
    """Compare, print the table and return the exit status."""
    args = parse_args(__doc__, "checkout of willisma/SiT (models.py, transport/)", argv=argv)
    torch.set_num_threads(1)
    refs = load_or_report(lambda: import_reference(args.reference, "transport", args.timm_shim, stand_in=True),
                          args.reference)
    if refs is None:
        return 2
    ref_models, ref_transport = refs
    timm_from = args.timm_shim or "common.py's stand-in (explicit-softmax attention)"
    print(f"torch {torch.__version__}, float32, 1 thread; reference {args.reference}; timm: {timm_from}")
    start, table = time.time(), Table(BOUNDS)
    check_models(table, ref_models)
    check_losses(table, ref_transport)
    check_samplers(table, ref_models, ref_transport)
    return table.report(time.time() - start)


if __name__ == "__main__":
    sys.exit(main())
