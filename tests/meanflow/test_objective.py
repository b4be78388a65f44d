"""MeanFlowObjective's draws, loss and guided target against the official code's formulas written out
here from the paper's equations (py-meanflow's `forward_with_loss`, the JAX code's `guidance_fn` and
`cond_drop`), its two JVP paths, and the JVP itself against finite differences and autograd."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tests.meanflow._tiny import batch, step_model, tiny_config, tiny_model

from dit_trainer.errors import ConfigError
from dit_trainer.meanflow.jvp import DIFFERENCE_STEP, central_difference, time_derivative
from dit_trainer.objective import build_objective


def draws_for(x, seed=2, t=None, r=None):
    """Injected (t, r, noise): both r = t and r < t, some t outside a guidance range."""
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    t = torch.tensor([0.9, 0.7, 0.5, 0.35, 0.15, 0.6])[:n] if t is None else t
    r = torch.tensor([0.2, 0.7, 0.1, 0.35, 0.05, 0.0])[:n] if r is None else r
    return {"t": t, "r": r, "noise": torch.randn(x.shape, generator=g)}


def paper_net(model, y, drop):
    """The network in the paper's time and direction: u(z, t, h) = -net(z, 1 - t, h)."""
    return lambda z, t, h, labels_drop=drop: -model(z, 1 - t, y=y, force_drop_ids=labels_drop, h=h)


def reference_loss(net, x, e, t, r, v_target, p, eps, tangent=None):
    """py-meanflow's forward_with_loss for given e, t, r, with the tangent v_target (v, or JAX's guided v_g), or
    `tangent` where given (iMF's: the network's own velocity)."""
    tt, rr = t.view(-1, 1, 1, 1), r.view(-1, 1, 1, 1)
    z = (1 - tt) * x + tt * e
    with sdpa_kernel(SDPBackend.MATH):  # the kernel forward-mode AD goes through on a CPU
        u, dudt = torch.func.jvp(lambda z, t, r: net(z, t, t - r), (z, t, r),
                                 (v_target if tangent is None else tangent, torch.ones_like(t), torch.zeros_like(r)))
    u_tgt = (v_target - (tt - rr).clamp(0, 1) * dudt).detach()
    loss = ((u - u_tgt) ** 2).sum(dim=(1, 2, 3))
    return loss / (loss.detach() + eps) ** p


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(), *batch()


def test_draws_follow_the_official_order_and_formulas():
    objective = build_objective(tiny_config())
    n = 2000
    d = objective.draw(n, (1, 2, 2), torch.Generator().manual_seed(0), torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    t0, r0 = (torch.sigmoid(torch.randn(n, generator=g) * 1.0 - 0.4) for _ in range(2))
    t, r = torch.maximum(t0, r0), torch.minimum(t0, r0)
    r = torch.where(torch.rand(n, generator=g) < 0.75, t, r)
    assert torch.equal(d["t"], t) and torch.equal(d["r"], r)
    assert torch.equal(d["noise"], torch.randn((n, 1, 2, 2), generator=g))
    assert bool((d["r"] <= d["t"]).all()) and 0.22 < float((d["r"] != d["t"]).float().mean()) < 0.28
    v1 = build_objective(tiny_config(tr_sampler="v1", r_logit_mean=-4.0, ratio=0.75))
    d1 = v1.draw(n, (1,), torch.Generator().manual_seed(0), torch.device("cpu"))
    assert bool((d1["r"] <= d1["t"]).all()) and 0.7 < float((d1["r"] != d1["t"]).float().mean()) < 0.8


def test_loss_equals_py_meanflow_formula(tiny):
    model, x, y, drop = tiny
    objective = build_objective(tiny_config(omega=1.0, kappa=0.0, norm_p=0.75, norm_eps=1e-3))
    d = draws_for(x)
    got = objective.losses(step_model(model, y, drop), x, d)
    want = reference_loss(paper_net(model, y, drop), x, d["noise"], d["t"], d["r"], d["noise"] - x, 0.75, 1e-3)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got.shape == (x.shape[0],) and bool((got > 0).all())


def test_guided_target_equals_jax_guidance_and_cond_drop(tiny):
    """JAX: v_g = omega v + (1 - omega - kappa) v_uncond + kappa v_cond for t in [t_start, t_end], v elsewhere
    and for the samples whose label is dropped (which see the null label in u)."""
    model, x, y, drop = tiny
    # norm_p 0: the squared error itself (the adaptive weight would press every loss towards 1)
    m = {"omega": 1.5, "kappa": 0.3, "guidance_t_start": 0.3, "guidance_t_end": 0.8, "norm_p": 0.0}
    objective = build_objective(tiny_config(**m))
    d = draws_for(x)
    got = objective.losses(step_model(model, y, drop), x, d)
    net = paper_net(model, y, drop)
    t, e = d["t"], d["noise"]
    tt = t.view(-1, 1, 1, 1)
    z, v = (1 - tt) * x + tt * e, e - x
    with torch.no_grad():
        v_uncond = net(z, t, torch.zeros_like(t), torch.ones_like(drop))
        v_cond = net(z, t, torch.zeros_like(t), torch.zeros_like(drop))
    inside = ((t >= 0.3) & (t <= 0.8)).view(-1, 1, 1, 1)
    omega, kappa = torch.where(inside, 1.5, 1.0), torch.where(inside, 0.3, 0.0)
    v_g = omega * v + (1 - omega - kappa) * v_uncond + kappa * v_cond
    v_g = torch.where(drop.bool().view(-1, 1, 1, 1), v, v_g)
    want = reference_loss(net, x, e, t, d["r"], v_g, 0.0, 0.01)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    plain = build_objective(tiny_config(omega=1.0, kappa=0.0, norm_p=0.0)).losses(step_model(model, y, drop), x, d)
    assert not torch.allclose(got, plain)  # the guidance reached the target


def test_separate_and_graph_paths_give_one_loss_and_gradient(tiny):
    _, x, y, drop = tiny
    grads = {}
    for path in ("separate", "graph"):
        model = tiny_model()  # fresh gradients
        loss = build_objective(tiny_config(jvp=path, norm_p=0.5)).losses(step_model(model, y, drop), x, draws_for(x)).mean()
        loss.backward()
        grads[path] = (loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    (loss_s, g_s), (loss_g, g_g) = grads["separate"], grads["graph"]
    torch.testing.assert_close(loss_s, loss_g, rtol=1e-6, atol=0)
    assert g_s.keys() == g_g.keys() and any(k.startswith("h_embedder.") for k in g_s)
    for k in g_s:  # relative to each gradient's norm: elementwise, rounding differs by CPU's vector width
        assert (g_s[k] - g_g[k]).norm() <= 1e-5 * g_s[k].norm(), k
    assert g_s["h_embedder.mlp.2.weight"].abs().sum() > 0  # the interval is learnt


def test_jvp_equals_finite_difference_and_autograd(tiny):
    model, x, y, drop = tiny
    model = model.eval()
    net = paper_net(model, y, None)
    d = draws_for(x)
    tt = d["t"].view(-1, 1, 1, 1)
    z, v = (1 - tt) * x + tt * d["noise"], d["noise"] - x

    def u(z, t, r):
        return net(z, t, t - r)

    _, dudt = time_derivative(u, z, d["t"], d["r"], v)
    ones, zeros = torch.ones_like(d["t"]), torch.zeros_like(d["r"])
    with sdpa_kernel(SDPBackend.MATH):  # autograd's JVP is a double backward, which the fused kernels lack too
        _, auto = torch.autograd.functional.jvp(u, (z, d["t"], d["r"]), (v, ones, zeros))
    eps = 1e-3
    fd = (u(z + eps * v, d["t"] + eps, d["r"]) - u(z - eps * v, d["t"] - eps, d["r"])) / (2 * eps)
    scale = dudt.abs().max()
    assert (dudt - auto).abs().max() / scale < 1e-5
    assert (dudt - fd).abs().max() / scale < 2e-3
    ours = central_difference(u, z, d["t"], d["r"], v)
    assert (dudt - ours).abs().max() / scale < 1e-3  # fp32 at DIFFERENCE_STEP: truncation and rounding
    assert (ours - central_difference(u, z, d["t"], d["r"], v, step=DIFFERENCE_STEP * 4)).abs().max() > 0
    model.train()


def test_central_difference_is_as_close_to_the_jvp_at_the_ends_of_the_trained_times(tiny):
    """Within a step of t = 1 and of r = t the difference reads the network a step past its trained times (its
    time below 0, h below 0): smooth there, it stays as close to the JVP as inside, unlike a one-sided one."""
    model, x, y, drop = tiny
    model = model.eval()
    net = paper_net(model, y, None)
    t = torch.tensor([0.999, 0.9975, 0.7, 0.5, 0.35, 1.0])
    r = torch.tensor([0.2, 0.1, 0.698, 0.499, 0.3, 0.0])  # rows 0, 1, 5 near t = 1; rows 2, 3 near r = t
    d = draws_for(x, t=t, r=r)
    tt = t.view(-1, 1, 1, 1)
    z, v = (1 - tt) * x + tt * d["noise"], d["noise"] - x

    def u(z, t, r):
        return net(z, t, t - r)

    _, dudt = time_derivative(u, z, t, r, v)
    ours = central_difference(u, z, t, r, v)
    s = DIFFERENCE_STEP
    ahead, behind = torch.clamp(1 - t, max=s), torch.clamp(t - r, max=s)  # the room left inside
    a, b = ahead.view(-1, 1, 1, 1), behind.view(-1, 1, 1, 1)
    with torch.no_grad():
        inside = (u(z + a * v, t + ahead, r) - u(z - b * v, t - behind, r)) / (a + b)
    for row in (0, 1, 2, 3, 5):
        scale = dudt[row].abs().max()
        err = (ours[row] - dudt[row]).abs().max() / scale
        assert err < 1e-3
        assert (inside[row] - dudt[row]).abs().max() / scale > 5 * err
    model.train()


def test_difference_path_trains_as_the_jvp_does(tiny):
    """jvp: difference differs from separate only in du/dt: losses and gradients agree to the difference's error."""
    _, x, y, drop = tiny
    grads = {}
    for path in ("separate", "difference"):
        model = tiny_model()
        loss = build_objective(tiny_config(jvp=path, norm_p=0.5, ratio=1.0)).losses(step_model(model, y, drop), x,
                                                                                    draws_for(x)).mean()
        loss.backward()
        grads[path] = (loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    (loss_s, g_s), (loss_d, g_d) = grads["separate"], grads["difference"]
    torch.testing.assert_close(loss_d, loss_s, rtol=1e-3, atol=0)
    assert (g_d - g_s).norm() / g_s.norm() < 1e-3


@pytest.mark.parametrize("path", ["separate", "graph"])
def test_predicted_tangent_takes_du_dt_along_the_networks_own_velocity(tiny, path):
    """iMF's tangent: du/dt along sg(u(z_t, t, t)) under each sample's own condition (the dropped one's null
    label), while the target velocity stays v (here guided, as the JAX code's v_g)."""
    model, x, y, drop = tiny
    m = {"omega": 1.5, "kappa": 0.0, "norm_p": 0.0, "ratio": 1.0, "jvp": path}
    got = build_objective(tiny_config(tangent="predicted", **m)).losses(step_model(model, y, drop), x, draws_for(x))
    net = paper_net(model, y, drop)
    d = draws_for(x)
    t, e = d["t"], d["noise"]
    tt = t.view(-1, 1, 1, 1)
    z, v = (1 - tt) * x + tt * e, e - x
    with torch.no_grad():
        own = net(z, t, torch.zeros_like(t))
        v_uncond = net(z, t, torch.zeros_like(t), torch.ones_like(drop))
    v_g = torch.where(drop.bool().view(-1, 1, 1, 1), v, v_uncond + 1.5 * (v - v_uncond))
    want = reference_loss(net, x, e, t, d["r"], v_g, 0.0, 0.01, tangent=own)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    sample = build_objective(tiny_config(**m)).losses(step_model(model, y, drop), x, draws_for(x))
    assert not torch.allclose(got, sample)  # the tangent reached du/dt


def test_the_predicted_tangent_and_the_difference_run_in_float32_the_rest_under_autocast(tiny, monkeypatch):
    """Each call's `amp`: the loss's forward and the unconditional velocity under the run's autocast, the
    tangent and the difference's two forwards outside it (a bf16 tangent would carry its rounding into du/dt)."""
    from dit_trainer.train.step_model import StepModel

    model, x, y, drop = tiny
    seen, call = [], StepModel.__call__

    def recording(self, x_t, t, h=None, drop=None, amp=True, w=None):
        kind = "unconditional" if drop is not None else "loss" if bool((h != 0).any()) else "tangent"
        seen.append((kind, amp))
        return call(self, x_t, t, h=h, drop=drop, amp=amp, w=w)

    monkeypatch.setattr(StepModel, "__call__", recording)
    objective = build_objective(tiny_config(tangent="predicted", jvp="difference", omega=1.5, kappa=0.0, ratio=1.0))
    d = draws_for(x, r=torch.tensor([0.2, 0.6, 0.1, 0.3, 0.05, 0.0]))  # every r below its t
    objective.losses(step_model(model, y, drop), x, d)
    kinds = [kind for kind, _ in seen]
    assert kinds[:3] == ["loss", "unconditional", "tangent"] and len(kinds) == 5  # then the difference's two
    assert [amp for _, amp in seen] == [True, True, False, False, False]


def test_meanflow_has_no_single_output_loss():
    with pytest.raises(NotImplementedError, match="losses"):
        build_objective(tiny_config()).loss(torch.zeros(1), torch.zeros(1), {})


@pytest.mark.parametrize("meanflow,match", [
    ({"ratio": 1.5}, "meanflow.ratio"), ({"jvp": "forward"}, "meanflow.jvp"), ({"tr_sampler": "v2"}, "tr_sampler"),
    ({"tangent": "velocity"}, "meanflow.tangent"),
    ({"logit_std": 0.0}, "logit_std"), ({"guidance_t_start": 0.9, "guidance_t_end": 0.5}, "guidance_t_start"),
    ({"steps": 2, "timesteps": [1.0, 0.0]}, "steps 2"), ({"steps": 1, "timesteps": [0.0, 1.0]}, "fall from 1"),
])
def test_bad_meanflow_keys_are_one_line_errors(meanflow, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(**meanflow)


def test_at_r_equal_t_the_loss_is_flow_matching_of_the_transport_objective(tiny):
    """With r = t the target is v itself: MeanFlow's loss at paper time t is SiT's velocity loss at 1 - t
    (summed over a sample instead of averaged), which pins the two time conventions to each other."""
    from dit_trainer.config import build_config

    model, x, y, drop = tiny
    d = draws_for(x)
    d["r"] = d["t"].clone()
    meanflow = build_objective(tiny_config(omega=1.0, kappa=0.0, norm_p=0.0)).losses(step_model(model, y, drop), x, d)
    transport = build_objective(build_config({"objective": "transport", "model": {"name": "SiT-S/2"}}))
    flow = transport.losses(step_model(model, y, drop), x, {"t": 1 - d["t"], "noise": d["noise"]})
    torch.testing.assert_close(meanflow / x[0].numel(), flow, rtol=1e-5, atol=1e-7)
