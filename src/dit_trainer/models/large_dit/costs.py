"""Large-DiT's counts for the layout planner (`dit plan`): parameters, FLOPs and the activations
one layer keeps for its backward, from the sizes alone (no model is built).

Counted with saved-tensor hooks on a small DiT-LLaMA under bf16 autocast: the float32 residual
stream enters both RMSNorms and both modulations, autocast's bf16 copies of the attention and
SwiGLU inputs, q, k and v after the rotary embedding (kv heads repeated to the query heads on the
CPU matmul path), the attention output, wo's and w2's outputs (the gates multiply them), and four
SwiGLU-wide tensors (w1 and w3 outputs, SiLU's output and the product w2 reads).
"""

from dit_trainer.models.costs import ModelCosts, Params, PerToken, transformer_costs, with_time_embedders
from dit_trainer.models.large_dit.config import LargeDiTConfig
from dit_trainer.models.large_dit.layers import cond_dim, swiglu_hidden
from dit_trainer.models.spec import build_kwargs

FREQUENCY_EMBEDDING = 256  # TimestepEmbedder's sinusoid width


def large_dit_costs(cfg, name: str, sizes: tuple) -> ModelCosts:
    """The planner's counts for the DiT-LLaMA registered as `name`, of named `sizes` = (dim, n_layers, n_heads)."""
    shared, o = build_kwargs(cfg, LargeDiTConfig)
    d = o.dim or sizes[0]
    depth = o.n_layers or sizes[1]
    heads = o.n_heads or sizes[2]
    kv = (o.n_kv_heads or heads) * (d // heads)  # width of k and of v
    h = swiglu_hidden(d, o.multiple_of, o.ffn_dim_multiplier)
    cd = cond_dim(d)
    p, size = o.patch_size, shared.get("input_size", 32)
    c_in = shared.get("in_channels", 4)
    c_out = 2 * c_in if shared.get("learn_sigma", True) else c_in
    classes = shared.get("num_classes", 1000) + (shared.get("class_dropout_prob", 0.1) > 0)
    n = (size // p) ** 2
    f = FREQUENCY_EMBEDDING

    token_weights = 2 * d * d + 2 * d * kv + 3 * d * h  # wq, wo, wk, wv, w1, w3, w2
    qk_norm = 2 * d + 2 * kv if o.qk_norm else 0  # LayerNorm weight and bias of q and of k
    block = Params(trainable=token_weights + cd * 6 * d + 6 * d + 2 * d + qk_norm, tensors=11 + (4 if o.qk_norm else 0),
                   tp_split=token_weights + qk_norm, matmul=token_weights + cd * 6 * d + 6 * d)
    patch_in, patch_out = c_in * p * p, c_out * p * p
    first_matmul = patch_in * d + d + f * cd + cd + cd * cd + cd
    first = Params(trainable=first_matmul + classes * cd, tensors=7, matmul=first_matmul)
    last_matmul = d * patch_out + patch_out + cd * 2 * d + 2 * d
    last = Params(trainable=last_matmul, tensors=4, matmul=last_matmul)

    qk_extra = PerToken(act_tp=2 * d) if o.qk_norm else PerToken()
    saved_none = PerToken(fp32=2 * d, resid=2 * d, act=4 * d, act_tp=6 * d + 4 * h) + qk_extra
    saved_selective = PerToken(resid=d, act=d, act_tp=2 * d + 2 * kv + 2 * h)
    costs = transformer_costs(
        name, depth, n, d, heads, block, first, last, token_weights,
        block_flops_per_image=2 * 6 * cd * d,
        edge_flops=2 * (patch_in * d + d * patch_out) + 2 * (f * cd + cd * cd + 2 * cd * d) / n,
        saved={"none": saved_none, "full": PerToken(resid=d), "selective": saved_selective},
        # w1 out, w3 out, q k v, attention out, SwiGLU in, scores, product, attention in, wo out, w2 out.
        compiled_items=(PerToken(act_tp=h), PerToken(act_tp=h), PerToken(act_tp=3 * d), PerToken(act_tp=d),
                        PerToken(act=d), PerToken(act_tp=heads * n), PerToken(act_tp=h), PerToken(act=d),
                        PerToken(act=d), PerToken(act=d)) + ((qk_extra,) if o.qk_norm else ()),
        transient=PerToken(resid=d, act_tp=h / 2),
        edge_saved=PerToken(resid=d, act=d + patch_out),
        # SiLU and the gate's product are cheap pointwise ops (DiT's tanh GELU is its own class).
        elementwise={"pointwise": PerToken(fp32=10 * d, act_tp=12 * d + 2 * h), "norm": PerToken(fp32=2 * d),
                     "softmax": PerToken(act_tp=heads * n)},
        tp_modules=7 + (2 if o.qk_norm else 0),
        # wo and w2 outputs forward; back, the input gradient of each of wq, wk, wv, w1 and w3.
        tp_allreduces=(2, 5),
        tp_divides=(heads, o.n_kv_heads or heads, h),
    )
    return with_time_embedders(costs, cfg, cd, f)
