#!/usr/bin/env python
"""Numerical parity of dit_trainer's DiT and diffusion with the original facebookresearch/DiT code.

Usage: python scripts/parity/dit.py --reference /path/to/DiT-checkout [--timm-shim DIR]

The reference checkout must hold the original `models.py` and `diffusion/` package; both are
imported from there, never copied. The original `models.py` imports
`timm.models.vision_transformer`; if timm is not installed, --timm-shim names a folder that holds a
stand-in `timm` package (PatchEmbed, Attention, Mlp) to put first on sys.path.

Both implementations get the same weights (ours randomised, then copied with
`load_state_dict(strict=True)` in both directions, which also checks every parameter name) and the
same inputs. Each row is the relative max difference max|ours - ref| / max|ref| against the bound
the project claims:

  model     < 1e-4  forward (eval, train with label dropout, timm's explicit-softmax attention path)
                    and forward_with_cfg (ours with cfg_channels=3, the release's choice)
  one-step  < 1e-5  q_sample, q_posterior_mean_variance, training_losses (every key),
                    p_mean_variance (every key), for linear & cosine schedules x learned / fixed sigma
  loop      < 1e-4  DDIM "ddim25" and DDPM "10" sample loops (DDPM: global RNG seeded alike before
                    each loop), plus a guided DDIM loop as the release's sample.py runs it; every
                    step's sample and x_0 prediction is compared, not only the final sample

Our "cosine" schedule is compared with the reference's "squaredcos_cap_v2". DDPM loops clip x_0
to [-1, 1] so that each step's noise stays visible next to a random model's x_0 predictions. After
the table, notes list tensors whose same-seed initialisation differs from the release; they are
informational (outputs are compared with shared weights) and do not fail the run.

Exit status: 0 when every row passes, 1 when any fails, 2 when the reference cannot be imported.
Runs on CPU in float32 with one thread, in well under two minutes.
"""

import os
import sys
import time
import traceback

import numpy as np
import torch
from common import Table, import_reference, load_or_report, parse_args, randomise_, rel_diff, share_weights

BOUNDS = {"model": 1e-4, "one-step": 1e-5, "loop": 1e-4}


def set_fused_attention(model, fused):
    """Switch timm's Attention between F.scaled_dot_product_attention and explicit softmax."""
    n = 0
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = fused
            n += 1
    return n


def model_pair(ref_models, name, **kwargs):
    """Our model and the release's, each built from the same seed."""
    from dit_trainer.models import DiT, DiT_models

    if name in DiT_models:
        torch.manual_seed(0)
        ours = DiT_models[name](**kwargs)
        torch.manual_seed(0)
        theirs = ref_models.DiT_models[name](**kwargs)
    else:
        torch.manual_seed(0)
        ours = DiT(**kwargs)
        torch.manual_seed(0)
        theirs = ref_models.DiT(**kwargs)
    return ours, theirs


def init_differences(ours, theirs):
    """Names of tensors that differ right after construction with the same seed (informational)."""
    o, r = ours.state_dict(), theirs.state_dict()
    return [k for k in o if k in r and o[k].shape == r[k].shape and not torch.equal(o[k], r[k])]


def check_models(table, ref_models, notes):
    """The model rows: forward in eval and train mode, against explicit softmax, with guidance."""
    configs = [
        ("DiT-S/2", dict(input_size=32, num_classes=1000, learn_sigma=True), 4),
        ("DiT-S/2", dict(input_size=32, num_classes=1000, learn_sigma=False), 4),
        ("DiT-B/4", dict(input_size=32, num_classes=1000, learn_sigma=True), 2),
        ("custom", dict(input_size=12, patch_size=2, in_channels=4, hidden_size=96, depth=3, num_heads=4,
                        num_classes=10, learn_sigma=True), 4),
        ("custom", dict(input_size=12, patch_size=3, in_channels=3, hidden_size=64, depth=2, num_heads=2,
                        mlp_ratio=2.0, class_dropout_prob=0.0, num_classes=7, learn_sigma=False), 4),
    ]
    for seed, (name, kwargs, batch) in enumerate(configs):
        sigma = "learned" if kwargs.get("learn_sigma", True) else "fixed"
        label = f"{name} in{kwargs['input_size']} {sigma}σ"
        if name == "custom":
            label = (f"custom d{kwargs['depth']} h{kwargs['hidden_size']} p{kwargs['patch_size']} "
                     f"in{kwargs['input_size']} c{kwargs['in_channels']} {sigma}σ")
        try:
            ours, theirs = model_pair(ref_models, name, **kwargs)
            diffs = init_differences(ours, theirs)
            if diffs:
                notes.append(f"{label}: same-seed initialisation differs in {', '.join(diffs)}")
            table.add("model", f"{label}: pos_embed at init", rel_diff(ours.pos_embed, theirs.pos_embed))
            randomise_(ours, 1000 + seed)
            share_weights(ours, theirs)
        except Exception as exc:  # noqa: BLE001 - one broken config must not hide the others
            table.fail("model", f"{label}: build / load_state_dict", f"{type(exc).__name__}: {exc}")
            continue

        g = torch.Generator().manual_seed(seed)
        c, s, n_cls = ours.in_channels, kwargs["input_size"], kwargs["num_classes"]
        x = torch.randn(batch, c, s, s, generator=g)
        t = torch.randint(0, 1000, (batch,), generator=g)
        t[0] = 0
        y = torch.randint(0, n_cls, (batch,), generator=g)
        if kwargs.get("class_dropout_prob", 0.1) > 0:
            y[-1] = n_cls  # the null class row used by classifier-free guidance
        with torch.no_grad():
            ours.eval(), theirs.eval()
            ref_out = theirs(x, t, y)
            table.add("model", f"{label}: forward", rel_diff(ours(x, t, y), ref_out))

            if set_fused_attention(theirs, False):
                table.add("model", f"{label}: forward vs explicit-softmax attn", rel_diff(ours(x, t, y), theirs(x, t, y)))
                set_fused_attention(theirs, True)

            ours.train(), theirs.train()
            torch.manual_seed(7)
            a = ours(x, t, y)
            torch.manual_seed(7)
            b = theirs(x, t, y)
            table.add("model", f"{label}: forward (train, label dropout)", rel_diff(a, b))
            ours.eval(), theirs.eval()

            if c >= 3:
                y_cfg = torch.cat([y[: batch // 2], torch.full((batch // 2,), n_cls)])
                if kwargs.get("class_dropout_prob", 0.1) > 0:
                    a = ours.forward_with_cfg(x, t, y_cfg, 4.0, cfg_channels=3)
                    b = theirs.forward_with_cfg(x, t, y_cfg, 4.0)
                    table.add("model", f"{label}: forward_with_cfg (cfg_channels=3)", rel_diff(a, b))
        del ours, theirs


def check_diffusion(table, ref_models, ref_diffusion):
    """The one-step and loop rows for every schedule and sigma setting."""
    from dit_trainer.diffusion import create_diffusion
    from dit_trainer.models import DiT

    B, C, S, N_CLS = 4, 4, 8, 10
    for k, (ours_sched, ref_sched) in enumerate([("linear", "linear"), ("cosine", "squaredcos_cap_v2")]):
        for learn_sigma in (True, False):
            tag = f"{ours_sched} {'learned' if learn_sigma else 'fixed'}σ"
            kwargs = dict(input_size=S, patch_size=2, in_channels=C, hidden_size=64, depth=2, num_heads=4,
                          num_classes=N_CLS, learn_sigma=learn_sigma)
            try:
                torch.manual_seed(0)
                ours_m = DiT(**kwargs)
                theirs_m = ref_models.DiT(**kwargs)
                randomise_(ours_m, 2000 + 2 * k + learn_sigma)
                share_weights(ours_m, theirs_m)
                ours_m.eval(), theirs_m.eval()
                d_ours = create_diffusion("", noise_schedule=ours_sched, learn_sigma=learn_sigma)
                d_ref = ref_diffusion.create_diffusion("", noise_schedule=ref_sched, learn_sigma=learn_sigma)
            except Exception as exc:  # noqa: BLE001
                table.fail("one-step", f"{tag}: setup", f"{type(exc).__name__}: {exc}")
                continue

            one_step(table, tag, d_ours, d_ref, ours_m, theirs_m, B, C, S, N_CLS, seed=10 + k)
            loops(table, tag, ours_sched, ref_sched, learn_sigma, ours_m, theirs_m, ref_diffusion, B, C, S, N_CLS)


def compare_dicts(table, group, label, ours, ref):
    """One row per key of two dicts of tensors, which must have the same keys."""
    if set(ours) != set(ref):
        table.fail(group, label, f"keys {sorted(ours)} vs reference {sorted(ref)}")
        return
    for key in sorted(ref):
        if ref[key] is None or ours[key] is None:
            if ref[key] is not ours[key]:
                table.fail(group, f"{label}[{key}]", "None on one side only")
            continue
        table.add(group, f"{label}[{key}]", rel_diff(ours[key], ref[key]))


def one_step(table, tag, d_ours, d_ref, ours_m, theirs_m, B, C, S, N_CLS, seed):
    """Schedule arrays, q_sample, posteriors, training losses and p_mean_variance at chosen timesteps."""
    try:
        arrays = ("betas", "alphas_cumprod", "posterior_variance", "posterior_log_variance_clipped",
                  "posterior_mean_coef1", "posterior_mean_coef2")
        worst = max(rel_diff(torch.from_numpy(np.asarray(getattr(d_ours, a))),
                             torch.from_numpy(np.asarray(getattr(d_ref, a)))) for a in arrays)
        table.add("one-step", f"{tag}: schedule arrays (float64)", worst)
        if list(d_ours.timestep_map) != list(d_ref.timestep_map):
            table.fail("one-step", f"{tag}: timestep_map", "differs")
    except Exception as exc:  # noqa: BLE001
        table.fail("one-step", f"{tag}: schedule arrays", f"{type(exc).__name__}: {exc}")

    g = torch.Generator().manual_seed(seed)
    x0 = torch.rand(B, C, S, S, generator=g) * 2 - 1
    x0[0, 0, 0, :3] = torch.tensor([-1.0, 1.0, 0.0])  # exercise the edge bins of the decoder NLL
    noise = torch.randn(B, C, S, S, generator=g)
    t = torch.tensor([0, 1, 437, 999])
    y = torch.randint(0, N_CLS, (B,), generator=g)
    mk = dict(y=y)

    table.add("one-step", f"{tag}: q_sample", rel_diff(d_ours.q_sample(x0, t, noise=noise),
                                                       d_ref.q_sample(x0, t, noise=noise)))
    x_t = d_ref.q_sample(x0, t, noise=noise)
    names = ("mean", "variance", "log_variance")
    for name, a, b in zip(names, d_ours.q_posterior_mean_variance(x0, x_t, t),
                          d_ref.q_posterior_mean_variance(x0, x_t, t)):
        table.add("one-step", f"{tag}: q_posterior_mean_variance[{name}]", rel_diff(a, b))
    with torch.no_grad():
        compare_dicts(table, "one-step", f"{tag}: training_losses",
                      d_ours.training_losses(ours_m, x0, t, model_kwargs=mk, noise=noise),
                      d_ref.training_losses(theirs_m, x0, t, model_kwargs=mk, noise=noise))
        for clip in (True, False):
            compare_dicts(table, "one-step", f"{tag}: p_mean_variance clip={clip}",
                          d_ours.p_mean_variance(ours_m, x_t, t, clip_denoised=clip, model_kwargs=mk),
                          d_ref.p_mean_variance(theirs_m, x_t, t, clip_denoised=clip, model_kwargs=mk))


def trajectory(steps):
    """Stack every step's sample and pred_xstart of a progressive sample loop."""
    outs = list(steps)
    return torch.stack([o["sample"] for o in outs]), torch.stack([o["pred_xstart"] for o in outs])


def loop_diff(ours, ref):
    """Worst relative difference over the whole trajectory: samples and x_0 predictions, every step.

    Comparing every step rather than only the final sample keeps the check sensitive to each
    step's noise, which the last DDPM steps of a schedule can all but wash out.
    """
    # Per step, since an unclipped x_0 prediction at t = T-1 of the cosine schedule is ~1e4 and
    # would otherwise set the scale for every later, O(1) step.
    return max(rel_diff(a, b) for kind in (0, 1) for a, b in zip(ours[kind], ref[kind]))


def loops(table, tag, ours_sched, ref_sched, learn_sigma, ours_m, theirs_m, ref_diffusion, B, C, S, N_CLS):
    """DDIM and DDPM sample loops with respacing, and a guided DDIM loop, every step compared."""
    from dit_trainer.diffusion import create_diffusion

    g = torch.Generator().manual_seed(99)
    z = torch.randn(B, C, S, S, generator=g)
    y = torch.randint(0, N_CLS, (B,), generator=g)
    cpu = torch.device("cpu")
    for respacing, kind in (("ddim25", "ddim"), ("10", "ddpm")):
        try:
            d_ours = create_diffusion(respacing, noise_schedule=ours_sched, learn_sigma=learn_sigma)
            d_ref = ref_diffusion.create_diffusion(respacing, noise_schedule=ref_sched, learn_sigma=learn_sigma)
            if list(d_ours.timestep_map) != list(d_ref.timestep_map):
                table.fail("loop", f"{tag}: {respacing} timestep_map", "differs")
                continue
            # A respaced one-step check too: the model must see base-process timesteps.
            t = torch.tensor([0, 1, d_ref.num_timesteps // 2, d_ref.num_timesteps - 1])
            with torch.no_grad():
                compare_dicts(table, "one-step", f"{tag} {respacing}: p_mean_variance",
                              d_ours.p_mean_variance(ours_m, z, t, model_kwargs=dict(y=y)),
                              d_ref.p_mean_variance(theirs_m, z, t, model_kwargs=dict(y=y)))
            run_ours = d_ours.ddim_sample_loop_progressive if kind == "ddim" else d_ours.p_sample_loop_progressive
            run_ref = d_ref.ddim_sample_loop_progressive if kind == "ddim" else d_ref.p_sample_loop_progressive
            # DDIM as the release's sample.py runs it (no clipping). DDPM clips x_0 to [-1, 1]: a random
            # model's unclipped x_0 at t = T-1 is huge, which would leave each step's O(1) noise
            # invisible to the comparison.
            clip = kind == "ddpm"
            common = dict(noise=z.clone(), clip_denoised=clip, model_kwargs=dict(y=y), device=cpu)
            torch.manual_seed(1234)
            a = trajectory(run_ours(ours_m.forward, z.shape, **common))
            common["noise"] = z.clone()
            torch.manual_seed(1234)
            b = trajectory(run_ref(theirs_m.forward, z.shape, **common))
            table.add("loop", f"{tag}: {kind.upper()} loop {respacing!r} clip={clip}, every step", loop_diff(a, b))

            if kind == "ddim" and learn_sigma:
                # As the release's sample.py: conditional + null halves, forward_with_cfg, scale 4.
                zz = torch.cat([z, z])
                yy = torch.cat([y, torch.full_like(y, N_CLS)])
                torch.manual_seed(1234)
                a = trajectory(d_ours.ddim_sample_loop_progressive(
                    lambda x, t, **kw: ours_m.forward_with_cfg(x, t, cfg_channels=3, **kw), zz.shape,
                    noise=zz.clone(), clip_denoised=False, model_kwargs=dict(y=yy, cfg_scale=4.0), device=cpu))
                torch.manual_seed(1234)
                b = trajectory(d_ref.ddim_sample_loop_progressive(
                    theirs_m.forward_with_cfg, zz.shape, noise=zz.clone(), clip_denoised=False,
                    model_kwargs=dict(y=yy, cfg_scale=4.0), device=cpu))
                table.add("loop", f"{tag}: DDIM loop {respacing!r} clip=False cfg=4, every step", loop_diff(a, b))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            table.fail("loop", f"{tag}: {kind} {respacing}", f"{type(exc).__name__}: {exc}")


def main(argv=None) -> int:
    """Compare, print the table and return the exit status."""
    args = parse_args(__doc__, "facebookresearch/DiT checkout holding models.py and diffusion/", argv=argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    start = time.time()
    refs = load_or_report(lambda: import_reference(args.reference, "diffusion", args.timm_shim), args.reference)
    if refs is None:
        return 2
    ref_models, ref_diffusion = refs
    timm = sys.modules.get("timm")
    print(f"torch {torch.__version__}, float32, 1 thread; reference {os.path.abspath(args.reference)}; "
          f"timm from {os.path.dirname(os.path.abspath(timm.__file__)) if timm else '?'}")

    table, notes = Table(BOUNDS), []
    check_models(table, ref_models, notes)
    check_diffusion(table, ref_models, ref_diffusion)

    print(table.render())
    for note in notes:
        print(f"note (not a parity check): {note}")
    failed = table.failed
    print(f"{len(table.rows) - len(failed)}/{len(table.rows)} checks pass; "
          f"worst per group: " + ", ".join(
              f"{g} {max((r[2] for r in table.rows if r[0] == g and r[2] is not None), default=float('nan')):.1e}"
              for g in BOUNDS)
          + f"; {time.time() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
