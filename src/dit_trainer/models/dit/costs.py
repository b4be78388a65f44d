"""DiT's counts for the layout planner (`dit plan`): parameters, FLOPs and the activations one
block keeps for its backward, from the sizes alone (no model is built).

The activation counts follow what the trainer's block saves under bf16 autocast (counted with
saved-tensor hooks on DiT-S/2): the float32 residual stream enters both LayerNorms and both
modulations (4 tensors of D), autocast's bf16 copies of the qkv and fc1 inputs, the fused qkv
output (the CPU matmul attention keeps q, k and v, views of it, and recomputes the scores), the
attention output that feeds proj, proj's and fc2's outputs (the gates multiply them), and fc1's and
GELU's outputs (4·D wide each). SiT shares the backbone and these counts.
"""

import re

from dit_trainer.models.costs import ModelCosts, Params, PerToken, transformer_costs
from dit_trainer.models.dit.config import DiTConfig
from dit_trainer.models.dit.sizes import SIZES
from dit_trainer.models.spec import build_kwargs

_NAME = re.compile(r"-(XL|L|B|S)/(\d+)$")
FREQUENCY_EMBEDDING = 256  # TimestepEmbedder's sinusoid width


def _sizes(name: str, options: DiTConfig) -> tuple:
    match = _NAME.search(str(name))
    depth, hidden, heads = SIZES[match.group(1)] if match else (None, None, None)
    patch = int(match.group(2)) if match else 2
    depth = options.depth or depth
    hidden = options.hidden_size or hidden
    heads = options.num_heads or heads
    return depth, hidden, heads, patch, options.mlp_ratio or 4.0


def dit_costs(cfg, name: str) -> ModelCosts:
    """The planner's counts for the DiT (or SiT) registered as `name`, sized by a Config, a ModelConfig or a mapping."""
    shared, options = build_kwargs(cfg, DiTConfig)
    depth, d, heads, p, mlp_ratio = _sizes(name, options)
    size = shared.get("input_size", 32)
    c_in = shared.get("in_channels", 4)
    c_out = 2 * c_in if shared.get("learn_sigma", True) else c_in
    classes = shared.get("num_classes", 1000) + (shared.get("class_dropout_prob", 0.1) > 0)
    n = (size // p) ** 2
    h = int(d * mlp_ratio)
    f = FREQUENCY_EMBEDDING

    # qkv, proj, fc1, fc2 act on every token (tensor parallelism splits them); adaLN on c only.
    token_weights = 4 * d * d + 2 * d * h
    block = Params(trainable=token_weights + 6 * d * d + (3 * d + d + h + d + 6 * d), tensors=10,
                   tp_split=token_weights + 3 * d + h, matmul=token_weights + 6 * d * d + 11 * d + h)
    patch_in, patch_out = c_in * p * p, c_out * p * p
    first_matmul = patch_in * d + d + f * d + d + d * d + d
    first = Params(trainable=first_matmul + classes * d, frozen=n * d, tensors=7, matmul=first_matmul)
    last_matmul = d * patch_out + patch_out + 2 * d * d + 2 * d
    last = Params(trainable=last_matmul, tensors=4, matmul=last_matmul)

    # Per-image work (timestep MLP, final adaLN) is spread over the tokens, as the trainer's MFU counts it.
    edge_flops = 2 * (patch_in * d + d * patch_out) + 2 * (f * d + d * d + 2 * d * d) / n
    saved_none = PerToken(fp32=2 * d, resid=2 * d, act=4 * d, act_tp=4 * d + 2 * h)
    # Selective keeps the matmul outputs (qkv, proj, fc1, fc2) beside the checkpointed input.
    saved_selective = PerToken(resid=d, act=2 * d, act_tp=3 * d + h)
    return transformer_costs(
        name, depth, n, d, heads, block, first, last, token_weights,
        block_flops_per_image=2 * 6 * d * d,
        edge_flops=edge_flops,
        saved={"none": saved_none, "full": PerToken(resid=d), "selective": saved_selective},
        # fc1 out, qkv out, attention out, fc1 in, scores, GELU out, qkv in, proj out, fc2 out.
        compiled_items=(PerToken(act_tp=h), PerToken(act_tp=3 * d), PerToken(act_tp=d), PerToken(act=d),
                        PerToken(act_tp=heads * n), PerToken(act_tp=h), PerToken(act=d), PerToken(act=d),
                        PerToken(act=d)),
        transient=PerToken(resid=d, act_tp=h / 2),
        edge_saved=PerToken(fp32=d, resid=d, act=d + patch_out),
        elementwise={"pointwise": PerToken(fp32=10 * d, act_tp=2 * d), "norm": PerToken(fp32=2 * d),
                     "act": PerToken(act_tp=h), "softmax": PerToken(act_tp=heads * n)},
        tp_modules=4,
        tp_allreduces=(2, 2),  # proj and fc2 outputs forward; the qkv and fc1 inputs' gradients back
        tp_divides=(heads, h),
    )
