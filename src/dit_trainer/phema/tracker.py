"""`PowerEMA`: the power-function EMA profiles of a run (`train.phema_stds`), tracked beside the EMA.

Each profile is a `ShardedEMA` of the model parts, so it is kept exactly like the parameters (DTensor
shards under FSDP/TP, this stage's blocks under PP) and updated on local shards without communication.
The update after step t uses the decay (1 - 1/t)^(gamma + 1), and a step the guard skips (on the host, or
masked on the device) leaves every profile as it is, as it leaves the EMA.
"""

import torch

from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.phema.paths import std_label
from dit_trainer.phema.profile import beta_at, std_to_gamma


class PowerEMA:
    """One power-function EMA per sigma_rel of `stds`, over the model parts; snapshots every `every` steps."""

    def __init__(self, model_parts, stds, dims=None, device=None, output_dir=None, every: int = 0, dtype: str = "fp16"):
        """`dims`/`device`: the run's mesh and device (for the snapshots' gather); `every`: steps between
        snapshots written to `output_dir/phema`; `dtype`: fp16 or fp32, what snapshots store."""
        self.stds = [float(s) for s in stds]
        self.gammas = [std_to_gamma(s) for s in self.stds]
        self.labels = [std_label(s) for s in self.stds]
        self.model_parts = [model_parts] if isinstance(model_parts, torch.nn.Module) else list(model_parts)
        self.profiles = {label: ShardedEMA(self.model_parts) for label in self.labels}
        self.dims, self.device, self.output_dir, self.every, self.dtype = dims, device, output_dir, every, dtype

    @classmethod
    def for_run(cls, model_parts, cfg, dims, device):
        """The tracker a Config asks for (`train.phema_stds`), or None when post-hoc EMA is off."""
        train = cfg.train
        if not train.phema_stds:
            return None
        every = train.phema_every or cfg.checkpoint.save_steps
        return cls(model_parts, train.phema_stds, dims, device, cfg.output_dir, every, train.phema_dtype)

    @torch.no_grad()
    def update(self, step: int, skip=None) -> None:
        """Average in the weights after optimizer step `step` (1-indexed); `skip`, a 0-d device tensor,
        leaves every profile as it is where 1 (a step masked on the device)."""
        for gamma, ema in zip(self.gammas, self.profiles.values()):
            ema.update(beta_at(step, gamma), skip=skip)

    def frozen_names(self) -> set:
        """FQNs of the parameters training does not change (this rank's parts): copied, not averaged."""
        return {n for part in self.model_parts for n, p in part.named_parameters() if not p.requires_grad}

    def state_dict(self) -> dict:
        """{label: {FQN: tensor}} (DTensor shards included), for checkpoints."""
        return {label: ema.state_dict() for label, ema in self.profiles.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` saved (full or sharded tensors, as `ShardedEMA.load_state_dict` takes);
        a full state holds every stage's parameters, of which a pipeline stage takes its own."""
        if set(state) != set(self.profiles):
            raise KeyError(f"post-hoc EMA profiles {sorted(state)} saved, {sorted(self.profiles)} tracked")
        for label, ema in self.profiles.items():
            missing = set(ema.shadow) - set(state[label])
            if missing:
                raise KeyError(f"post-hoc EMA profile {label} lacks {sorted(missing)[:3]}")
            ema.load_state_dict({k: v for k, v in state[label].items() if k in ema.shadow})

    def snapshot_due(self, step: int, max_steps: int) -> bool:
        """Whether step `step` writes a snapshot: every `every` steps and at the run's last step."""
        return step % self.every == 0 or step == max_steps

    def write_snapshot(self, step: int):
        """Write every profile's full weights at `step` to `output_dir/phema` (all ranks call it); returns
        the file's path on rank 0, None elsewhere."""
        from dit_trainer.phema.snapshots import write_snapshot

        return write_snapshot(self, self.output_dir, step)
