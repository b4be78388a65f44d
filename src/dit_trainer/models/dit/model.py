"""Scalable Diffusion Models with Transformers (Peebles & Xie, 2023).

A DiT turns a noised latent x_t, its timestep t and a class label y into a prediction of the
noise (and, with a learned sigma, of the variance interpolation). Conditioning enters every
block through adaptive LayerNorm whose modulation starts at zero (adaLN-Zero), so each block
begins as the identity. Names of modules and parameters follow the facebookresearch/DiT
release, so its checkpoints load with `strict=True`.
"""

import torch
import torch.nn as nn

from dit_trainer.models.dit.sizes import PATCHES, swiglu_width
from dit_trainer.models.dit.sizes import SIZES as _SIZES
from dit_trainer.models.guidance import guided_forward
from dit_trainer.models.interval import add_interval, zero_interval_embedding
from dit_trainer.models.layers import (Attention, FeedForward, Mlp, PatchEmbed, block_norm, init_backbone, set_io,
                                       timestep_embedding, unpatchify)
from dit_trainer.models.routing import run_blocks
from dit_trainer.repa.attach import aligned_depth, project


def modulate(x, shift, scale):
    """adaLN: scale and shift normalised tokens by per-sample conditioning vectors."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    """Embeds scalar timesteps: sinusoidal frequencies, then an MLP."""

    def __init__(self, hidden_size, frequency_embedding_size=256, freq_shift=0):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
        )
        self.frequency_embedding_size = frequency_embedding_size
        self.freq_shift = freq_shift

    timestep_embedding = staticmethod(timestep_embedding)

    def forward(self, t):
        return self.mlp(timestep_embedding(t, self.frequency_embedding_size, freq_shift=self.freq_shift))


class LabelEmbedder(nn.Module):
    """Embeds class labels; row `num_classes` is the null class that classifier-free guidance
    trains by dropping labels with probability `dropout_prob`."""

    def __init__(self, num_classes, hidden_size, dropout_prob):
        super().__init__()
        use_cfg_embedding = dropout_prob > 0
        self.embedding_table = nn.Embedding(num_classes + use_cfg_embedding, hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels, force_drop_ids=None):
        """Replace dropped labels by the null class."""
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop_ids = force_drop_ids == 1
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels, train, force_drop_ids=None):
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


class DiTBlock(nn.Module):
    """Transformer block with adaLN-Zero conditioning: six modulation vectors from c.

    The block options (`norm`, `mlp`, `qk_norm`, and RoPE over a `rope_grid` of tokens) default to
    the release's block; see `DiTConfig`.
    """

    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, mlp_norm_eps=1e-6, norm="layernorm", mlp="gelu",
                 qk_norm=False, rope_grid=0):
        super().__init__()
        self.norm1 = block_norm(norm, hidden_size, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True, qk_norm=qk_norm, rope_grid=rope_grid)
        self.norm2 = block_norm(norm, hidden_size, eps=mlp_norm_eps)
        if mlp == "swiglu":
            self.mlp = FeedForward(hidden_size, swiglu_width(hidden_size, mlp_ratio))
        else:
            self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x, c, positions=None):
        """`positions` (B, N): the token indices of x when it holds a routed subset (RoPE reads them)."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa), positions)
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm and a linear map from tokens to patches."""

    def __init__(self, hidden_size, patch_size, out_channels, norm="layernorm"):
        super().__init__()
        self.norm_final = block_norm(norm, hidden_size, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """Diffusion model with a transformer backbone."""

    def __init__(
        self,
        input_size=32,
        patch_size=2,
        in_channels=4,
        hidden_size=1152,
        depth=28,
        num_heads=16,
        mlp_ratio=4.0,
        class_dropout_prob=0.1,
        num_classes=1000,
        learn_sigma=True,
        timestep_freq_shift=0,
        mlp_norm_eps=1e-6,
        norm="layernorm",
        mlp="gelu",
        rope=False,
        qk_norm=False,
        interval_embedding=False,
        guidance_embedding=False,
    ):
        super().__init__()
        set_io(self, input_size, patch_size, in_channels, num_classes, learn_sigma)
        self.num_heads = num_heads

        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        # diffusers' port: timestep_freq_shift=1, mlp_norm_eps=1e-5 (the release: 0 and 1e-6).
        self.t_embedder = TimestepEmbedder(hidden_size, freq_shift=timestep_freq_shift)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        # A frozen Parameter rather than a buffer, as in the release: same state_dict, same count.
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size), requires_grad=False)
        # The block options keep the absolute sin-cos positions too, as LightningDiT does with RoPE.
        options = {"norm": norm, "mlp": mlp, "qk_norm": qk_norm, "rope_grid": input_size // patch_size if rope else 0}
        self.rope = bool(rope)  # routed tokens then carry their indices into the blocks
        self.blocks = nn.ModuleList(
            [DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio, mlp_norm_eps=mlp_norm_eps, **options)
             for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels, norm=norm)
        if interval_embedding:
            # MeanFlow's second time input, the interval h = t - r, embedded like t and added to c; absent
            # otherwise, so every other model's state dict is the release's.
            self.h_embedder = TimestepEmbedder(hidden_size, freq_shift=timestep_freq_shift)
        if guidance_embedding:  # improved MeanFlow's guidance scale as an input (models/interval.py)
            self.w_embedder = TimestepEmbedder(hidden_size, freq_shift=timestep_freq_shift)
        self.initialize_weights()

    def initialize_weights(self):
        """Xavier linears, sin-cos positions, and zeros wherever adaLN-Zero needs them."""
        init_backbone(self)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        zero_interval_embedding(self)

        for block in self.blocks:
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x):
        """(B, N, p*p*C) tokens back to (B, C, H, W) images."""
        # self.patch_size, not the embedder's: a later pipeline stage holds no embedder.
        return unpatchify(x, self.patch_size, self.out_channels)

    def embed(self, x, t, y, force_drop_ids=None, h=None, w=None):
        """Input stage: patch tokens with positions, and the conditioning vector c = t + y (+ h's embedding
        in a model built with `interval_embedding`, h None is 0; + the guidance scale's with
        `guidance_embedding`, w None is 1)."""
        tokens = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y, self.training, force_drop_ids)
        return tokens, add_interval(self, c, t, h, w)

    def head(self, tokens, c):
        """Output stage: final adaLN layer and unpatchify."""
        return self.unpatchify(self.final_layer(tokens, c))

    def forward(self, x, t, y, force_drop_ids=None, route=None, repa=False, h=None, w=None):
        """x: (B, C, H, W) latents, t: (B,) timesteps, y: (B,) labels -> (B, out_channels, H, W).

        `force_drop_ids` (B,) marks labels to replace by the null class; the trainer draws it from
        its own seeded generator so that every parallel layout drops the same labels. `route`
        (a `TokenRoute`, training only) sends a subset of the tokens through a span of blocks.
        `repa` (a model built with repa.enabled) also returns the projected tokens of block
        `repa_depth`: (output, projected). `h` (B,): MeanFlow's interval t - r, for a model built with
        `interval_embedding` (None: 0, where the model is its flow model). `w` (B,): the guidance scale the
        output is asked for, for a model built with `guidance_embedding` (None: 1).
        """
        tokens, c = self.embed(x, t, y, force_drop_ids, h, w)
        route = route if self.training else None
        if repa:
            tokens, hidden = run_blocks(self.blocks, tokens, c, route, rotary=self.rope, capture=aligned_depth(self))
            return self.head(tokens, c), project(self, hidden)
        tokens = run_blocks(self.blocks, tokens, c, route, rotary=self.rope)
        return self.head(tokens, c)

    def forward_with_cfg(self, x, t, y, cfg_scale, cfg_channels=None):
        """Classifier-free guidance: the batch holds conditional then unconditional halves.

        Guidance applies to the first `cfg_channels` output channels, by default all predicted-noise
        channels (`in_channels`). The original release guided only the first three (`cfg_channels=3`),
        which its published FIDs used.
        """
        return guided_forward(self.forward, x, t, y, cfg_scale, self.in_channels if cfg_channels is None else cfg_channels)


def _constructor(cls, prefix, size, patch):
    depth, hidden, heads = _SIZES[size]

    def build(**kwargs):
        # Size arguments may be overridden (small models for tests and the demo keep the family).
        kwargs = {"depth": depth, "hidden_size": hidden, "patch_size": patch, "num_heads": heads, **kwargs}
        return cls(**kwargs)

    build.__name__ = f"{prefix}_{size}_{patch}"
    build.__doc__ = f"{prefix}-{size}/{patch}: depth {depth}, hidden {hidden}, {heads} heads, patch {patch}."
    return build


def sized_constructors(cls, prefix: str) -> dict:
    """"{prefix}-{S,B,L,XL}/{2,4,8}" -> constructor of `cls` at the paper's sizes (DiT, and SiT on its backbone)."""
    return {f"{prefix}-{size}/{patch}": _constructor(cls, prefix, size, patch) for size in _SIZES for patch in PATCHES}


DiT_models = sized_constructors(DiT, "DiT")
DiT_XL_2, DiT_XL_4, DiT_XL_8 = (DiT_models[f"DiT-XL/{p}"] for p in (2, 4, 8))
DiT_L_2, DiT_L_4, DiT_L_8 = (DiT_models[f"DiT-L/{p}"] for p in (2, 4, 8))
DiT_B_2, DiT_B_4, DiT_B_8 = (DiT_models[f"DiT-B/{p}"] for p in (2, 4, 8))
DiT_S_2, DiT_S_4, DiT_S_8 = (DiT_models[f"DiT-S/{p}"] for p in (2, 4, 8))
