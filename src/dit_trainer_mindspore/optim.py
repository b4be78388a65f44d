"""AdamW with torch.optim.AdamW's exact update order (MindSpore 2.10's `mint.optim.AdamW` has no
CPU kernel, and `nn.AdamWeightDecay` has no bias correction, so neither matches the torch path)."""

import math

import numpy as np
from mindspore import Tensor, ops


class AdamW:
    """Decoupled weight decay, then Adam with bias correction: torch's single-tensor AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.step_count = 0
        self.exp_avg = {p.name: Tensor(np.zeros(p.shape, np.float32)) for p in self.params}
        self.exp_avg_sq = {p.name: Tensor(np.zeros(p.shape, np.float32)) for p in self.params}

    def __call__(self, grads):
        """Apply one update from `grads` (in the order of `params`)."""
        self.step_count += 1
        b1, b2 = self.betas
        lr = self.lr
        step_size = lr / (1 - b1 ** self.step_count)
        bc2_sqrt = math.sqrt(1 - b2 ** self.step_count)
        for p, g in zip(self.params, grads):
            value = p.value() * (1 - lr * self.weight_decay)
            m = self.exp_avg[p.name]
            m = m + (g - m) * (1 - b1)
            v = self.exp_avg_sq[p.name] * b2 + g * g * (1 - b2)
            self.exp_avg[p.name], self.exp_avg_sq[p.name] = m, v
            denom = ops.sqrt(v) / bc2_sqrt + self.eps
            p.set_data(value - step_size * (m / denom))

    def state(self) -> dict:
        """{name: Tensor} of the moments, for a checkpoint."""
        out = {f"adamw.exp_avg.{k}": v for k, v in self.exp_avg.items()}
        out.update({f"adamw.exp_avg_sq.{k}": v for k, v in self.exp_avg_sq.items()})
        return out

    def load_state(self, saved: dict, step_count: int) -> None:
        """Restore `state()` and the step count."""
        for k in self.exp_avg:
            self.exp_avg[k] = Tensor(saved[f"adamw.exp_avg.{k}"].asnumpy())
            self.exp_avg_sq[k] = Tensor(saved[f"adamw.exp_avg_sq.{k}"].asnumpy())
        self.step_count = int(step_count)
