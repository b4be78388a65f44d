"""AdamW and EMA as assignments to MindSpore Parameters, in torch.optim.AdamW's exact update
order (MindSpore 2.10's `mint.optim.AdamW` has no CPU kernel, and `nn.AdamWeightDecay` has no bias
correction, so neither matches the torch path). Written as plain ops so the whole train step,
update included, runs eagerly (PyNative) or as one compiled graph (`ms.jit`)."""

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, ops


def zeros_like_params(params, prefix):
    """Zero Parameters named `prefix.<name>` beside `params` (optimizer moments)."""
    return ParameterTuple(Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"{prefix}.{p.name}",
                                    requires_grad=False) for p in params)


def adamw_update(params, grads, exp_avg, exp_avg_sq, lr, weight_decay, beta1, beta2, eps, step_size, bc2_sqrt):
    """torch's single-tensor AdamW: decay, moments, bias-corrected step; scalars are float32 Tensors."""
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq):
        new_m = m + (g - m) * (1 - beta1)
        new_v = v * beta2 + g * g * (1 - beta2)
        denom = ops.sqrt(new_v) / bc2_sqrt + eps
        new_p = p * (1 - lr * weight_decay) - step_size * (new_m / denom)
        ops.assign(m, new_m)
        ops.assign(v, new_v)
        ops.assign(p, new_p)
    return True


def ema_update(ema, params, decay):
    """ema <- decay·ema + (1−decay)·param, as DiT's update_ema."""
    for e, p in zip(ema, params):
        ops.assign(e, e * decay + p * (1 - decay))
    return True
