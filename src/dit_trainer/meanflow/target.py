"""MeanFlow's regression target and loss (the official code's `forward` / `forward_with_loss`), paper's time.

With z_t = (1 - t) x + t e and v = e - x, the average velocity over [r, t] satisfies the MeanFlow identity
u(z_t, r, t) = v - (t - r) du/dt, du/dt = v ∂u/∂z + ∂u/∂t (r fixed), so the target is sg(v - (t - r) du/dt)
with du/dt one JVP of the network with tangents (v, 1, 0) on (z, t, r). Guidance folded into training
replaces v by a guided velocity built from the network's own instantaneous ones (h = 0).
"""

import torch


def _per_sample(a: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return a.reshape(-1, *([1] * (like.dim() - 1)))


def guided_velocity(v, t, v_uncond, v_cond=None, omega=1.0, kappa=0.0, t_start=0.0, t_end=1.0):
    """The JAX code's `guidance_fn`: omega v + (1 - omega - kappa) v_uncond + kappa v_cond where
    t_start <= t <= t_end, and v elsewhere (omega 1, kappa 0); without kappa, v_uncond + omega (v - v_uncond).
    `omega` is one number, or (n,) one per sample (improved MeanFlow's scale drawn per sample)."""
    inside = _per_sample((t >= t_start) & (t <= t_end), v)
    if torch.is_tensor(omega) and omega.dim():
        omega = _per_sample(omega.to(device=v.device, dtype=v.dtype), v)
    else:
        omega = torch.as_tensor(float(omega), dtype=v.dtype, device=v.device)
    w = torch.where(inside, omega, 1.0)
    if v_cond is None:
        return v_uncond + w * (v - v_uncond)
    k = torch.where(inside, torch.as_tensor(float(kappa), dtype=v.dtype, device=v.device), 0.0)
    return w * v + (1 - w - k) * v_uncond + k * v_cond


def meanflow_target(v, dudt, t, r):
    """sg(v - (t - r) du/dt), (t - r) clipped to [0, 1] as the JAX code does (a no-op for r <= t in [0, 1])."""
    return (v - _per_sample((t - r).clamp(0.0, 1.0), v) * dudt).detach()


def meanflow_loss(u, target, norm_p=1.0, norm_eps=0.01):
    """(n,) the squared error summed over each sample, over sg(that + norm_eps)^norm_p (the adaptive weight)."""
    loss = (u - target).pow(2).flatten(1).sum(1)
    if not norm_p:
        return loss
    return loss / (loss.detach() + norm_eps) ** norm_p
