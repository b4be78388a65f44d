"""Training FLOPs of one image through a DiT, for model FLOPs utilisation (MFU).

Counted the way PaLM's appendix B counts a transformer: 2 FLOPs per multiply-add of every matmul,
times 3 for forward plus backward (activation recomputation is not counted: MFU measures the
model's work, not the work a memory-saving choice adds). A weight applied to every token costs
2·T per parameter; the adaLN modulations and the timestep MLP act once per image on the
conditioning vector, so they cost 2 per parameter; attention adds 2·2·T²·D per block (QKᵀ and AV).
"""

import torch.nn as nn

# Modules applied once per image (to the conditioning vector c), not to each token.
_PER_IMAGE = ("adaLN_modulation", "t_embedder")


def dit_train_flops_per_image(model) -> float:
    """Forward+backward FLOPs of one image through `model` (a DiT built on this family's backbone)."""
    tokens = model.x_embedder.num_patches
    per_token = per_image = 0
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            if any(part in name for part in _PER_IMAGE):
                per_image += module.weight.numel()
            else:
                per_token += module.weight.numel()
    hidden = model.pos_embed.shape[-1]
    attention = 4 * tokens * tokens * hidden * len(model.blocks)
    forward = 2 * per_token * tokens + 2 * per_image + attention
    return 3.0 * forward
