"""DiT's counts for the layout planner (`dit plan`): parameters, FLOPs and the activations one
block keeps for its backward, from the sizes alone (no model is built).

The activation counts follow what the trainer's block saves under bf16 autocast (counted with
saved-tensor hooks on DiT-S/2): the float32 residual stream enters both LayerNorms and both
modulations (4 tensors of D), autocast's bf16 copies of the qkv and fc1 inputs, the fused qkv
output (the CPU matmul attention keeps q, k and v, views of it, and recomputes the scores), the
attention output that feeds proj, proj's and fc2's outputs (the gates multiply them), and fc1's and
GELU's outputs (4·D wide each). SiT shares the backbone and these counts; the block options
(`model.norm`, `model.mlp`, `model.rope`, `model.qk_norm`) add what their layers hold and keep.
"""

import re

from dit_trainer.models.costs import ModelCosts, Params, PerToken, transformer_costs, with_time_embedders
from dit_trainer.models.dit.config import DiTConfig
from dit_trainer.models.dit.sizes import SIZES, swiglu_width
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
    f = FREQUENCY_EMBEDDING
    swiglu, rms = options.mlp == "swiglu", options.norm == "rmsnorm"
    h = swiglu_width(d, mlp_ratio) if swiglu else int(d * mlp_ratio)

    # qkv, proj and the MLP act on every token (tensor parallelism splits them); adaLN on c only.
    token_weights = 4 * d * d + (3 if swiglu else 2) * d * h
    biases = 3 * d + d + 6 * d + (0 if swiglu else h + d)  # SwiGLU has none
    # RMSNorm's scales (norm1, norm2) and the q/k norms' (one head wide each) are replicated.
    scales = (2 * d if rms else 0) + (2 * (d // heads) if options.qk_norm else 0)
    block = Params(trainable=token_weights + 6 * d * d + biases + scales,
                   tensors=(9 if swiglu else 10) + 2 * rms + 2 * options.qk_norm,
                   tp_split=token_weights + 3 * d + (0 if swiglu else h), matmul=token_weights + 6 * d * d + biases)
    patch_in, patch_out = c_in * p * p, c_out * p * p
    first_matmul = patch_in * d + d + f * d + d + d * d + d
    first = Params(trainable=first_matmul + classes * d, frozen=n * d, tensors=7, matmul=first_matmul)
    last_matmul = d * patch_out + patch_out + 2 * d * d + 2 * d
    last = Params(trainable=last_matmul + d * rms, tensors=4 + rms, matmul=last_matmul)

    # Per-image work (timestep MLP, final adaLN) is spread over the tokens, as the trainer's MFU counts it.
    edge_flops = 2 * (patch_in * d + d * patch_out) + 2 * (f * d + d * d + 2 * d * d) / n
    # What the options keep besides (counted with the same hooks): RMSNorm its normalised input (for its
    # scale's gradient); the q/k norms or RoPE a new q and k that attention reads, the norms 2·D more of
    # their own (under bf16 RoPE's float32 copies of q and k too, not counted).
    new_qk = options.qk_norm or options.rope
    extra = [PerToken(fp32=2 * d)] * rms + [PerToken(act_tp=2 * d)] * (options.qk_norm + new_qk)
    # GELU's input and output, or SwiGLU's w1 and w3 outputs, SiLU's and the product w2 reads.
    mlp_saved = PerToken(act_tp=4 * h) if swiglu else PerToken(act_tp=2 * h)
    saved_none = sum(extra, PerToken(fp32=2 * d, resid=2 * d, act=4 * d, act_tp=4 * d) + mlp_saved)
    # Selective keeps the matmul outputs (qkv, proj, the MLP's) beside the checkpointed input.
    saved_selective = PerToken(resid=d, act=2 * d, act_tp=3 * d + (2 * h if swiglu else h))
    # fc1 out (SwiGLU: w1 and w3 out), qkv out, attention out, fc1 in, scores, GELU out (the product),
    # qkv in, proj out, fc2 out; then the options' own.
    mlp_out = (PerToken(act_tp=h), PerToken(act_tp=h)) if swiglu else (PerToken(act_tp=h),)
    compiled = (*mlp_out, PerToken(act_tp=3 * d), PerToken(act_tp=d), PerToken(act=d), PerToken(act_tp=heads * n),
                PerToken(act_tp=h), PerToken(act=d), PerToken(act=d), PerToken(act=d), *extra)
    # SiLU and the gate's product are cheap pointwise ops (tanh GELU is its own class); so is RoPE.
    pointwise = PerToken(fp32=10 * d, act_tp=2 * d + (2 * h if swiglu else 0) + (4 * d if options.rope else 0))
    elementwise = {"pointwise": pointwise, "norm": PerToken(fp32=2 * d, act_tp=2 * d if options.qk_norm else 0),
                   **({} if swiglu else {"act": PerToken(act_tp=h)}), "softmax": PerToken(act_tp=heads * n)}
    costs = transformer_costs(
        name, depth, n, d, heads, block, first, last, token_weights,
        block_flops_per_image=2 * 6 * d * d,
        edge_flops=edge_flops,
        saved={"none": saved_none, "full": PerToken(resid=d), "selective": saved_selective},
        compiled_items=compiled,
        transient=PerToken(resid=d, act_tp=h / 2),
        edge_saved=PerToken(fp32=d, resid=d, act=d + patch_out),
        elementwise=elementwise,
        tp_modules=(5 if swiglu else 4) + 2 * options.qk_norm,
        # proj's and the MLP's outputs forward; back, the gradients of the qkv and the MLP inputs (SwiGLU: w1's and w3's)
        tp_allreduces=(2, 3 if swiglu else 2),
        tp_divides=(heads, h),
    )
    return with_time_embedders(costs, cfg, d, f)
