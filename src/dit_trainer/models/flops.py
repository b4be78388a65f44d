"""Training FLOPs of one image through a DiT-shaped model (DiT, SiT, Large-DiT), for model FLOPs utilisation (MFU).

Counted the way PaLM's appendix B counts a transformer: 2 FLOPs per multiply-add of every matmul,
times 3 for forward plus backward (activation recomputation is not counted: MFU measures the
model's work, not the work a memory-saving choice adds). A weight applied to every token costs
2·T per parameter; the adaLN modulations and the timestep MLP act once per image on the
conditioning vector, so they cost 2 per parameter; attention adds 2·2·T²·D per block (QKᵀ and AV).
Under token routing a routed block's T is its kept tokens.
"""

import torch.nn as nn

from dit_trainer.models.interval import EMBEDDERS

# Modules applied once per image (to the conditioning vector c, or adding to it: MeanFlow's interval and
# guidance-scale embedders), not to each token.
_PER_IMAGE = ("adaLN_modulation", "t_embedder", *EMBEDDERS)


def _weights(module, prefix=""):
    """(per-token, per-image) matmul weight elements of `module`."""
    per_token = per_image = 0
    for name, sub in module.named_modules(prefix=prefix):
        if isinstance(sub, (nn.Linear, nn.Conv2d)):
            if any(part in name for part in _PER_IMAGE):
                per_image += sub.weight.numel()
            else:
                per_token += sub.weight.numel()
    return per_token, per_image


def train_flops_per_image(model, tokens_per_block=None) -> float:
    """Forward+backward FLOPs of one image through `model` (patch tokens, `blocks`, a `final_layer.linear`
    reading the hidden width); `tokens_per_block`: the tokens each block computes on (token routing),
    by default all of them."""
    tokens = (model.input_size // model.patch_size) ** 2
    hidden = model.final_layer.linear.in_features
    per_token, per_image = _weights(model)
    forward = 0
    for block, n in zip(model.blocks, tokens_per_block or [tokens] * len(model.blocks)):
        block_token, block_image = _weights(block, "block")
        per_token, per_image = per_token - block_token, per_image - block_image
        forward += 2 * block_token * n + 2 * block_image + 4 * n * n * hidden
    forward += 2 * per_token * tokens + 2 * per_image
    return 3.0 * forward
