"""PixArt's counts for the layout planner (`dit plan`): parameters, FLOPs and the activations one
block keeps for its backward, from the sizes alone (no model is built).

A PixArt block is a DiT block (its counts are `models/dit/costs.py`'s) without the per-block adaLN
map and with a cross-attention between attention and MLP. That adds, per image token, q_linear and
proj (tensor-parallel like attention's), attention over the caption's L tokens, and per caption token
kv_linear, spread over the image's N tokens as L / N. Under autocast the cross-attention keeps
q_linear's bf16 input, q, the attention output proj reads, and per caption token its own bf16 copy of
the projected caption and k and v. The caption projection runs once per caption token (with the
embedders, the first part); the timestep MLP, t_block and micro-conditions once per image.
"""

from dataclasses import replace

from dit_trainer.models.costs import ModelCosts, Params, PerToken, transformer_costs, with_time_embedders
from dit_trainer.models.pixart.config import PixArtConfig
from dit_trainer.models.pixart.sizes import release
from dit_trainer.models.spec import build_kwargs

FREQUENCY_EMBEDDING = 256  # the timestep and size embedders' sinusoid width


def text_tokens(cfg, name: str) -> int:
    """Caption tokens per image: `data.text_max_length`, else the release's (alpha 120, Sigma 300)."""
    data = getattr(cfg, "data", None)
    length = getattr(data, "text_max_length", 0) if data is not None else 0
    return int(length) or release(name).text_max_length


def pixart_costs(cfg, name: str) -> ModelCosts:
    """The planner's counts for the PixArt registered as `name`, sized by a Config, a ModelConfig or a mapping."""
    shared, options = build_kwargs(cfg, PixArtConfig)
    o = options.resolved(name)
    depth, d, heads = o["depth"], o["hidden_size"], o["num_heads"]
    c_txt, micro = o["text_hidden_size"], o["micro_conditions"]
    size, c_in, p = shared.get("input_size", 32), shared.get("in_channels", 4), 2
    c_out = 2 * c_in if shared.get("learn_sigma", True) else c_in
    n, length, f = (size // p) ** 2, text_tokens(cfg, name), FREQUENCY_EMBEDDING
    h = int(d * o["mlp_ratio"])

    # Per image token: attention's qkv and proj, cross-attention's q_linear and proj, the MLP; kv_linear
    # acts on the caption's tokens. Tensor parallelism splits all five.
    token_weights = 4 * d * d + 2 * d * d + 2 * d * h
    kv = 2 * d * d
    biases = 3 * d + d + d + 2 * d + d + h + d
    block = Params(trainable=token_weights + kv + biases + 6 * d, tensors=15,
                   tp_split=token_weights + kv + 3 * d + d + 2 * d + h, matmul=token_weights + kv + biases)
    third = d // 3
    micro_matmul = 2 * (f * third + third + third * third + third) if micro else 0
    first_matmul = (c_in * p * p * d + d + f * d + d + d * d + d + d * 6 * d + 6 * d
                    + c_txt * d + d + d * d + d + micro_matmul)
    first = Params(trainable=first_matmul, frozen=n * d, tensors=12 + 8 * micro, matmul=first_matmul)
    last_matmul = d * p * p * c_out + p * p * c_out
    last = Params(trainable=last_matmul + 2 * d, tensors=3, matmul=last_matmul)

    per_text = length / n  # caption tokens per image token
    # Per-image and per-caption-token work spread over the image tokens, as the DiT's counts do.
    per_image = 2 * (f * d + d * d + 6 * d * d) + (2 * 3 * (f * third + third * third) if micro else 0)
    edge_flops = 2 * (c_in * p * p * d + d * p * p * c_out) + per_image / n + 2 * (c_txt * d + d * d) * per_text
    # DiT's block keeps: the residual into both norms and modulations, bf16 copies of qkv's and fc1's inputs,
    # qkv's output, attention's output, proj's and fc2's outputs (gated), fc1's and GELU's outputs.
    dit_like = PerToken(fp32=2 * d, resid=2 * d, act=4 * d, act_tp=4 * d + 2 * h)
    cross = PerToken(act=d + d * per_text, act_tp=2 * d + 2 * d * per_text)
    saved_none = dit_like + cross
    saved_selective = PerToken(resid=d, act=2 * d, act_tp=3 * d + h) + PerToken(act_tp=2 * d + 2 * d * per_text)
    compiled = (PerToken(act_tp=h), PerToken(act_tp=3 * d), PerToken(act_tp=d), PerToken(act=d),
                PerToken(act_tp=heads * n), PerToken(act_tp=h), PerToken(act=d), PerToken(act=d), PerToken(act=d),
                PerToken(act_tp=2 * d), PerToken(act=d), PerToken(act_tp=2 * d * per_text), PerToken(act=d * per_text))
    costs = transformer_costs(
        name, depth, n, d, heads, block, first, last, token_weights,
        block_flops_per_image=0.0,
        edge_flops=edge_flops,
        saved={"none": saved_none, "full": PerToken(resid=d), "selective": saved_selective},
        compiled_items=compiled,
        transient=PerToken(resid=d, act_tp=h / 2),
        edge_saved=PerToken(fp32=d, resid=d, act=d + p * p * c_out + (c_txt + 2 * d) * per_text),
        elementwise={"pointwise": PerToken(fp32=8 * d, act_tp=2 * d), "norm": PerToken(fp32=2 * d),
                     "act": PerToken(act_tp=h), "softmax": PerToken(act_tp=heads * (n + length))},
        tp_modules=7,
        # attention's, cross-attention's and the MLP's outputs forward; back, the gradients of their inputs
        tp_allreduces=(3, 4),
        tp_divides=(heads, h),
    )
    # Cross-attention's kv_linear on the caption and its scores over L keys, and two fused kernels' outputs.
    costs = replace(costs, block_flops=costs.block_flops + 2 * kv * per_text + 4 * length * d,
                    fused_attention=PerToken(fp32=2 * heads, act_tp=2 * d))
    return with_time_embedders(costs, cfg, d, f)
