"""Class labels (DiT, SiT, Large-DiT): the label id, dropped to the model's null class.

The model replaces a dropped label by its learned null class itself (`force_drop_ids`, the
release's `LabelEmbedder.token_drop`), so the step's model call is the release's:
`model(x_t, t, y=y, force_drop_ids=drop)`, with the dropout mask drawn as `torch.rand(n) < p`.
"""

import torch

from dit_trainer.condition import DROPOUT_KEYS
from dit_trainer.condition.base import Condition
from dit_trainer.errors import ConfigError


class ClassCondition(Condition):
    """A class label per sample; row `num_classes` of the label table is the null class."""

    name = "class"
    keys = ("y",)
    dropout_key = DROPOUT_KEYS["class"]

    def __init__(self, num_classes: int, dropout_prob: float = 0.1):
        super().__init__(dropout_prob)
        self.num_classes = int(num_classes)

    @classmethod
    def from_config(cls, cfg, model=None):
        """`model.num_classes` labels, dropped with `model.class_dropout_prob`."""
        return cls(getattr(model, "num_classes", cfg.model.num_classes), cfg.model.class_dropout_prob)

    def inputs(self, batch, device) -> dict:
        """{"y": labels} of a `{"x", "y"}` dict or an `(x, y)` pair."""
        y = batch["y"] if isinstance(batch, dict) else batch[1]
        return {"y": y.to(device, dtype=torch.long, non_blocking=True)}

    def draw_drop(self, n: int, generator) -> torch.Tensor:
        # int64, as the release's force_drop_ids: the same draw, the same bits in every checkpoint.
        return super().draw_drop(n, generator).long()

    def drop(self, kwargs: dict, mask: torch.Tensor) -> dict:
        return {**kwargs, "force_drop_ids": mask}

    def unconditional(self, n: int, device) -> dict:
        return {"y": torch.full((n,), self.num_classes, dtype=torch.long, device=device)}

    def from_labels(self, labels, device) -> dict:
        """The keyword arguments of class ids `labels` (sampling's conditional half)."""
        y = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ConfigError(f"class labels must lie in 0..{self.num_classes - 1}, got {y.tolist()}")
        return {"y": y.to(device)}
