#!/usr/bin/env python
"""Numerical parity of dit_trainer's MeanFlow objective with the official code.

Usage: python scripts/parity/meanflow_parity.py [--reference /path/to/py-meanflow-checkout]

The official PyTorch code (Gsunshine/py-meanflow) trains a CIFAR U-Net and the official ImageNet code
(Gsunshine/meanflow) is JAX; neither is imported for the rows that always run. Those compare our objective,
on a small SiT with the interval input (depth 2, width 64, random weights everywhere), with the two codes'
formulas written out here from their source: py-meanflow's `MeanFlow.forward_with_loss` and the JAX
`MeanFlow.forward` with its `guidance_fn` and `cond_drop`. With --reference, py-meanflow's own
`meanflow/models/meanflow.py` is imported from the checkout (never copied) and run on the same network,
its draws of (t, r, e) replayed from the global RNG.

The two codes' time is the paper's (t = 1 noise); our network sees SiT's (1 - t) and predicts -u. The
rows hold that mapping too: the reference network is ours called as u(z, t, h) = -net(z, 1 - t, h).

Rows (relative max difference max|ours - ref| / max|ref|, float32, CPU, one thread):
  loss    < 1e-6  per-sample losses for injected (x, e, y, t, r) against py-meanflow's forward_with_loss
                  formula (sg target from torch.func.jvp with tangents (v, 1, 0), squared error summed, adaptive
                  weight (loss + c)^p with its p 0.75, c 1e-3), for both JVP paths (separate, graph)
  cfg     < 1e-6  per-sample losses with guidance folded in against the JAX code's forward (omega, kappa, a
                  t-range, the first samples' labels dropped as cond_drop drops them, p 1, c 0.01)
  imf     < 1e-6  `meanflow.tangent predicted` against improved MeanFlow's forward (Lyy-iiis/imeanflow, imf.py)
                  unguided and without its v-head: the JVP's tangent the network's own velocity at h = 0, the
                  loss the compound V = u + (t - r) sg(du/dt) against v, unweighted (p 0)
  jvp     < 1e-5  du/dt of our JVP against torch.autograd.functional.jvp
  fd      < 2e-3  du/dt against a central finite difference (step 1e-3, float32)
  sample  < 1e-6  1-step and 3-step samples against the JAX code's solver_step loop
  (with --reference)
  draws   < 1e-6  our (t, r) for py-meanflow's v0 and v1 settings against its sample_two_timesteps
  official < 1e-6 our mean loss against py-meanflow's MeanFlow.forward_with_loss itself (v0 and v1), and our
                  1-step sample against its MeanFlow.sample

Exit status: 0 when every row passes, 1 when any fails, 2 when the reference cannot be imported.
"""

import argparse
import copy
import os
import sys
import time
import types

import torch
import torch.nn as nn
from common import Table, load_or_report, randomise_, rel_diff
from torch.nn.attention import SDPBackend, sdpa_kernel

BOUNDS = {"loss": 1e-6, "cfg": 1e-6, "imf": 1e-6, "jvp": 1e-5, "fd": 2e-3, "sample": 1e-6, "draws": 1e-6, "official": 1e-6}
MODEL = {"name": "SiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10, "learn_sigma": False,
         "depth": 2, "hidden_size": 64, "num_heads": 4}
# py-meanflow's CIFAR scripts (v0: the paper's sampler; v1: its default) and its adaptive weight.
PY_MEANFLOW = {"v0": {"P_mean_t": -2.0, "P_std_t": 2.0, "P_mean_r": -2.0, "P_std_r": 2.0},
               "v1": {"P_mean_t": -0.6, "P_std_t": 1.6, "P_mean_r": -4.0, "P_std_r": 1.6}}


def config(**meanflow):
    from dit_trainer.config import build_config

    return build_config({"objective": "meanflow", "model": MODEL, "meanflow": meanflow})


def our_model(seed=3):
    """Our tiny SiT with the interval input, every weight random (the interval's zero init would hide it)."""
    from dit_trainer.models import get_spec

    torch.manual_seed(0)
    model = get_spec(MODEL["name"]).build_model_fn(config())
    randomise_(model, seed)
    return model.train()


def step_model(model, y, drop):
    """What the trainer hands the objective: the network with this batch's labels and dropout mask, fp32."""
    import contextlib

    from dit_trainer.train.step_model import StepModel

    from dit_trainer.condition.label import ClassCondition
    from dit_trainer.train.step_model import HeldCondition

    held = HeldCondition(ClassCondition(model.num_classes), {"y": y}, drop)
    return StepModel(model, held.condition.drop(held.kwargs, drop), contextlib.nullcontext, held=held)


def paper_net(model, y, drop):
    """Our network in the codes' time and direction: u(z, t, h) = -net(z, 1 - t, h), `drop` its label mask."""
    return lambda z, t, h, mask=drop: -model(z, 1 - t, y=y, force_drop_ids=mask, h=h)


def _per_sample(a):
    return a.view(-1, 1, 1, 1)


def py_meanflow_loss(net, x, e, t, r, v, p, c):
    """py-meanflow's forward_with_loss for given e, t, r, per sample (before its mean), with the tangent v."""
    z = (1 - _per_sample(t)) * x + _per_sample(t) * e
    u_pred, dudt = torch.func.jvp(lambda z, t, r: net(z, t, t - r), (z, t, r),
                                  (v, torch.ones_like(t), torch.zeros_like(r)))
    u_tgt = (v - _per_sample(t - r) * dudt).detach()
    loss = ((u_pred - u_tgt) ** 2).sum(dim=(1, 2, 3))
    return loss / (loss.detach() + c) ** p


def jax_guided_loss(net, x, e, t, r, drop, omega, kappa, t_start, t_end, p=1.0, c=0.01):
    """The JAX forward: guidance_fn's v_g (kappa > 0 branch), cond_drop's v_g = v for the dropped samples
    (the first sum(mask) of the batch), the JVP with tangent v_g, u_tgt = v_g - clip(t - r, 0, 1) du/dt."""
    z = (1 - _per_sample(t)) * x + _per_sample(t) * e
    v = e - x
    with torch.no_grad():
        v_uncond = net(z, t, torch.zeros_like(t), torch.ones_like(drop))
        v_cond = net(z, t, torch.zeros_like(t), torch.zeros_like(drop))
    inside = _per_sample((t >= t_start) & (t <= t_end))
    w, k = torch.where(inside, omega, 1.0), torch.where(inside, kappa, 0.0)
    v_g = w * v + (1 - w - k) * v_uncond + k * v_cond
    v_g = torch.where(_per_sample(drop.bool()), v, v_g)
    u, dudt = torch.func.jvp(lambda z, t, r: net(z, t, t - r), (z, t, r), (v_g, torch.ones_like(t), torch.zeros_like(r)))
    u_tgt = (v_g - _per_sample((t - r).clamp(0, 1)) * dudt).detach()
    loss = ((u - u_tgt) ** 2).sum(dim=(1, 2, 3))
    return loss / (loss + c).detach() ** p


def imf_loss(net, x, e, t, r, p=1.0, c=0.01):
    """improved MeanFlow's forward with omega 1 (v_g = v) and its v-head term left out: the JVP along the network's
    own velocity v_c at h = 0 (no gradient), V = u + (t - r) sg(du/dt), the error of V against v summed."""
    z = (1 - _per_sample(t)) * x + _per_sample(t) * e
    v = e - x
    with torch.no_grad():
        v_c = net(z, t, torch.zeros_like(t))
    u, dudt = torch.func.jvp(lambda z, t, r: net(z, t, t - r), (z, t, r), (v_c, torch.ones_like(t), torch.zeros_like(r)))
    compound = u + _per_sample(t - r) * dudt.detach()
    loss = ((compound - v) ** 2).sum(dim=(1, 2, 3))
    return loss / (loss + c).detach() ** p


def injected(n=6, seed=4):
    g = torch.Generator().manual_seed(seed)
    x, e = torch.randn(n, 4, 8, 8, generator=g), torch.randn(n, 4, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    t = torch.tensor([0.95, 0.7, 0.5, 0.35, 0.15, 0.6])
    r = torch.tensor([0.2, 0.7, 0.1, 0.35, 0.05, 0.0])
    return x, e, y, t, r


def check_loss(table, model):
    from dit_trainer.objective import build_objective

    x, e, y, t, r = injected()
    drop = torch.zeros_like(y)
    want = py_meanflow_loss(paper_net(model, y, drop), x, e, t, r, e - x, 0.75, 1e-3)
    for path in ("separate", "graph"):
        objective = build_objective(config(omega=1.0, kappa=0.0, norm_p=0.75, norm_eps=1e-3, jvp=path))
        got = objective.losses(step_model(model, y, drop), x, {"t": t, "r": r, "noise": e})
        table.add("loss", f"py-meanflow forward_with_loss formula, jvp {path}", rel_diff(got, want))
    # p = 0, the squared error itself: the adaptive weight presses every loss towards 1 and would hide a difference
    objective = build_objective(config(omega=1.0, kappa=0.0, norm_p=0.0))
    got = objective.losses(step_model(model, y, drop), x, {"t": t, "r": r, "noise": e})
    table.add("loss", "same, unweighted (p 0)", rel_diff(got, py_meanflow_loss(paper_net(model, y, drop), x, e, t, r,
                                                                                 e - x, 0.0, 1e-3)))


def check_cfg(table, model):
    from dit_trainer.objective import build_objective

    x, e, y, t, r = injected()
    drop = torch.tensor([1, 1, 0, 0, 0, 0])  # cond_drop drops the batch's first samples
    for omega, kappa, lo, hi in ((1.0, 0.5, 0.0, 1.0), (1.5, 0.3, 0.3, 0.8)):
        m = {"omega": omega, "kappa": kappa, "guidance_t_start": lo, "guidance_t_end": hi}
        want = jax_guided_loss(paper_net(model, y, drop), x, e, t, r, drop, omega, kappa, lo, hi, p=0.0)
        got = build_objective(config(norm_p=0.0, **m)).losses(step_model(model, y, drop), x, {"t": t, "r": r, "noise": e})
        table.add("cfg", f"JAX forward, omega {omega} kappa {kappa} t in [{lo}, {hi}], p 0", rel_diff(got, want))
    want = jax_guided_loss(paper_net(model, y, drop), x, e, t, r, drop, 1.0, 0.5, 0.0, 1.0)
    got = build_objective(config()).losses(step_model(model, y, drop), x, {"t": t, "r": r, "noise": e})
    table.add("cfg", "JAX forward, its defaults (omega 1, kappa 0.5, p 1, c 0.01)", rel_diff(got, want))


def check_imf(table, model):
    from dit_trainer.objective import build_objective

    x, e, y, t, r = injected()
    drop = torch.zeros_like(y)
    # p 0, the squared error itself: with p 1 every loss is about 1, and the tangent's change would hide in it
    want = imf_loss(paper_net(model, y, drop), x, e, t, r, p=0.0)
    for path in ("separate", "graph"):
        objective = build_objective(config(omega=1.0, kappa=0.0, norm_p=0.0, tangent="predicted", jvp=path))
        got = objective.losses(step_model(model, y, drop), x, {"t": t, "r": r, "noise": e})
        table.add("imf", f"imf.py forward (omega 1, no v-head, p 0), tangent predicted, jvp {path}",
                  rel_diff(got, want))


def check_jvp(table, model):
    from dit_trainer.meanflow.jvp import time_derivative

    x, e, y, t, r = injected()
    net = paper_net(model.eval(), y, None)

    def u(z, t, r):
        return net(z, t, t - r)

    z, v = (1 - _per_sample(t)) * x + _per_sample(t) * e, e - x
    _, dudt = time_derivative(u, z, t, r, v)
    _, auto = torch.autograd.functional.jvp(u, (z, t, r), (v, torch.ones_like(t), torch.zeros_like(r)))
    table.add("jvp", "torch.func.jvp (ours) vs torch.autograd.functional.jvp", rel_diff(dudt, auto))
    step = 1e-3
    fd = (u(z + step * v, t + step, r) - u(z - step * v, t - step, r)) / (2 * step)
    table.add("fd", "du/dt vs central difference, step 1e-3", rel_diff(dudt, fd))
    model.train()


def jax_sample(net, z, times):
    """The JAX code's generate loop: solver_step z - (t - r) u(z, t, h = t - r) over t_steps."""
    for t, r in zip(times[:-1], times[1:]):
        tt = torch.full((len(z),), t)
        z = z - (t - r) * net(z, tt, tt - r)
    return z


def check_sample(table, model):
    from dit_trainer.objective import build_objective

    model = model.eval()
    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(4, 4, 8, 8, generator=g), torch.tensor([0, 3, 7, 9])
    objective = build_objective(config())
    with torch.no_grad():
        for times in ([1.0, 0.0], [1.0, 0.6, 0.3, 0.0]):
            want = jax_sample(paper_net(model, y, None), z, times)
            got = objective.sample(lambda x, t, **kw: model(x, t, **kw), z, steps=len(times) - 1, model_kwargs={"y": y},
                                   timesteps=times)
            table.add("sample", f"{len(times) - 1}-step sample vs the JAX solver_step loop", rel_diff(got, want))
    model.train()


# -- py-meanflow itself ------------------------------------------------------------------------------


def load_py_meanflow(reference):
    """py-meanflow's models.meanflow and models.time_sampler, imported from the checkout's meanflow/ folder."""
    import importlib

    root = os.path.abspath(os.path.join(reference, "meanflow"))
    if not os.path.isfile(os.path.join(root, "models", "meanflow.py")):
        raise FileNotFoundError(f"{root}/models/meanflow.py does not exist")
    if "models" in sys.modules:
        raise RuntimeError("a module named 'models' is already imported; cannot import the reference's")
    sys.path.insert(0, root)
    modules = importlib.import_module("models.meanflow"), importlib.import_module("models.time_sampler")
    for mod in modules:
        if not os.path.abspath(mod.__file__).startswith(root + os.sep):
            raise RuntimeError(f"{mod.__name__} was imported from {mod.__file__}, not from {root}")
    return modules


class PaperNet(nn.Module):
    """py-meanflow's network signature on ours: net(z, (t, h), aug_cond) -> u in the paper's direction."""

    def __init__(self, model, y, drop):
        super().__init__()
        self.model, self.y, self.drop = model, y, drop

    def forward(self, z, times, aug_cond=None):
        t, h = times
        return -self.model(z, 1 - t, y=self.y, force_drop_ids=self.drop, h=h)


def reference_args(version):
    return types.SimpleNamespace(ema_decay=0.9999, ema_decays=[], tr_sampler=version, ratio=0.75, norm_p=0.75,
                                 norm_eps=1e-3, **PY_MEANFLOW[version])


def our_settings(version):
    """Our meanflow section for py-meanflow's settings of `version` (its ratio: the share with r != t)."""
    s = PY_MEANFLOW[version]
    return {"tr_sampler": version, "logit_mean": s["P_mean_t"], "logit_std": s["P_std_t"], "ratio": 0.75,
            "r_logit_mean": s["P_mean_r"], "r_logit_std": s["P_std_r"], "norm_p": 0.75, "norm_eps": 1e-3,
            "omega": 1.0, "kappa": 0.0}


def check_official(table, model, meanflow_module, time_sampler):
    from dit_trainer.meanflow.timesteps import sample_t_r
    from dit_trainer.objective import build_objective

    x, _, y, _, _ = injected(n=64)
    drop = torch.zeros_like(y)
    for version in ("v0", "v1"):
        cfg = config(**our_settings(version))
        torch.manual_seed(11)
        t_ref, r_ref = time_sampler.sample_two_timesteps(reference_args(version), 4096, torch.device("cpu"))
        torch.manual_seed(11)
        t, r = sample_t_r(4096, cfg.meanflow)
        table.add("draws", f"(t, r) vs sample_two_timesteps {version}", max(rel_diff(t, t_ref), rel_diff(r, r_ref)))
        official = meanflow_module.MeanFlow(lambda: PaperNet(copy.deepcopy(model), y, drop), reference_args(version), {})
        torch.manual_seed(12)
        want = official.forward_with_loss(x, None)
        torch.manual_seed(12)  # its draws in its order: e, then (t, r)
        e = torch.randn_like(x)
        t, r = sample_t_r(len(x), cfg.meanflow)
        for path in ("separate", "graph"):
            cfg.meanflow.jvp = path
            got = build_objective(cfg).losses(step_model(model, y, drop), x, {"t": t, "r": r, "noise": e}).mean()
            table.add("official", f"mean loss vs MeanFlow.forward_with_loss, {version}, jvp {path}", rel_diff(got, want))
    net = PaperNet(official.net.model, y[:4], drop[:4]).eval()
    torch.manual_seed(13)
    with torch.no_grad():
        want = official.sample((4, 4, 8, 8), net=net, device=torch.device("cpu"))
        torch.manual_seed(13)
        z = torch.randn(4, 4, 8, 8)
        got = build_objective(config()).sample(lambda a, t, **kw: net.model(a, t, force_drop_ids=drop[:4], **kw), z,
                                               steps=1, model_kwargs={"y": y[:4]})
    table.add("official", "1-step sample vs MeanFlow.sample", rel_diff(got, want))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", metavar="DIR", default=None,
                        help="a checkout of github.com/Gsunshine/py-meanflow: also compare with its code itself")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    reference = None
    if args.reference:
        reference = load_or_report(lambda: load_py_meanflow(args.reference), args.reference)
        if reference is None:
            return 2
    table = Table(BOUNDS)
    model = our_model()
    # The references' JVPs through our network need a kernel with forward-mode AD, as ours use.
    with sdpa_kernel(SDPBackend.MATH):
        check_loss(table, model)
        check_cfg(table, model)
        check_imf(table, model)
        check_jvp(table, model)
        check_sample(table, model)
        if reference is not None:
            check_official(table, model, *reference)
    return table.report(time.perf_counter() - start)


if __name__ == "__main__":
    sys.exit(main())
