"""The condition interface: what a model is conditioned on, read from a batch, dropped for guidance,
and made unconditional, as one value the trainer's step, sampling and export are handed.

See docs/design.md, "conditions". Every tensor a condition hands the model has the batch as its
leading dim, so a micro-batch or a data-parallel rank takes its rows with `v[sl]` and no stage
needs to know what the tensors mean.
"""

import torch


class Condition:
    """Base class: a batch's model keyword arguments, the dropout of guidance, the null condition."""

    name = "condition"
    keys: tuple = ()  # the batch keys read, which are also the model's keyword arguments' names
    dropout_key = "the condition's dropout"  # the config key of `dropout_prob`, for messages
    # Whether the training-time grid samples rows of model keyword arguments (prompts or held-out data's)
    # instead of the class labels `logging.sample_classes` names.
    grid_from_rows = False

    def __init__(self, dropout_prob: float = 0.0):
        self.dropout_prob = float(dropout_prob)

    def bind(self, dataset, device) -> None:
        """Take what the condition needs from the training data (the null caption's encoding); nothing by default."""

    def check_config(self, cfg) -> None:
        """A one-line ConfigError for what a run asks that this condition cannot do; nothing by default."""

    def default_val_split(self, n: int) -> int:
        """Samples of an `n`-sample dataset held out for validation where `data.val_split` is not set: none by
        default, so a run's data order and logs stay as they were unless it asks."""
        return 0

    def inputs(self, batch, device) -> dict:
        """The model's keyword arguments of `batch` on `device` (each (B, ...)), in their training dtype."""
        raise NotImplementedError

    def draw_drop(self, n: int, generator) -> torch.Tensor:
        """(n,) which rows of the global batch guidance's dropout makes unconditional, from `generator` only.

        The trainer draws it right after the objective's draws; ranks slice it, so every layout
        drops the rows one process drops."""
        return torch.rand(n, generator=generator) < self.dropout_prob

    def drop(self, kwargs: dict, mask: torch.Tensor) -> dict:
        """`kwargs` with the rows where `mask` holds made unconditional (what the model is called with)."""
        raise NotImplementedError

    def unconditional(self, n: int, device) -> dict:
        """The keyword arguments of `n` unconditional rows (classifier-free guidance's second half)."""
        raise NotImplementedError

    def guidance_kwargs(self, kwargs: dict, uncond: dict) -> dict:
        """The keyword arguments of a doubled batch, [conditional; unconditional], key by key; a key the
        unconditional rows do not set (an image's micro-conditions) repeats the conditional rows'."""
        return {k: torch.cat([v, uncond.get(k, v)]) for k, v in kwargs.items()}
