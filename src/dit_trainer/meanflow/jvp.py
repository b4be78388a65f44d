"""du/dt of the network along the flow: one Jacobian-vector product with tangents (v, 1, 0) on (z, t, r).

Two paths. `graph` (py-meanflow's): the prediction u that the loss regresses comes out of the JVP itself,
its backward through the JVP's primal: one forward fewer, but DDP's reducer fails at the second step
(its bucket rebuild meets the JVP's tensors without storage). `separate`: the JVP under no_grad gives only
du/dt, and the loss's u comes from an ordinary forward, so the backward is any train step's and every
layout (DDP, FSDP, AC, compile) runs it as it runs flow matching. Under `train.compile` the JVP itself runs
eager. Tensor parallelism cannot run either: DTensor's autograd Functions have no forward derivative. Attention goes through a kernel that
forward-mode AD differentiates (`models.attention.forward_ad_attention`).

`difference` takes du/dt without forward-mode AD: a central difference along the same tangent, two
forwards under no_grad in fp32 (error O(step^2), measured against the JVP in tests/meanflow). It costs
less than the JVP where forward-mode AD is slow (a CPU's dual tensors, or attention kernels without a
forward derivative), and like `separate` it leaves the loss's forward and backward to the train step.
"""

import torch

from dit_trainer.models.attention import forward_ad_attention


def time_derivative(u_fn, z, t, r, v, graph: bool = False):
    """(u, du/dt) of u_fn(z, t, r) along (v, 1, 0); with `graph` u keeps its autograd graph, else neither does."""
    tangents = (v, torch.ones_like(t), torch.zeros_like(r))
    # Compiled blocks run eager inside the JVP: dynamo cannot trace torch.func.jvp over a compiled function
    # called from eager (pytorch#128711), and each attempt would cost a compile that is then thrown away.
    with forward_ad_attention(), torch.compiler.set_stance("force_eager"):
        if graph:
            return torch.func.jvp(u_fn, (z, t, r), tangents)
        with torch.no_grad():
            return torch.func.jvp(u_fn, (z, t, r), tangents)


DIFFERENCE_STEP = 5e-3  # in the paper's t: rounding in fp32 (~1e-7 / step) and truncation (~step^2) both near 1e-5


def central_difference(u_fn, z, t, r, v, step: float = DIFFERENCE_STEP):
    """du/dt of u_fn(z, t, r) along (v, 1, 0) as (u(z + s v, t + s, r) - u(z - s v, t - s, r)) / 2s, no gradient."""
    # Within a step of t = 1 or of r = t this reads the network up to one step past where it is trained (its
    # time just below 0, or h just below 0). It is smooth there, so the central difference stays second-order;
    # a one-sided one kept inside would be first-order, 40-80x further from the JVP (tests/meanflow).
    s = torch.as_tensor(step, dtype=z.dtype, device=z.device)
    with torch.no_grad():
        ahead = u_fn(z + s * v, t + step, r)
        behind = u_fn(z - s * v, t - step, r)
    return (ahead - behind) / (2 * s)
