"""Large-DiT (DiT-LLaMA, Alpha-VLLM 2024): DiT's adaLN-Zero conditioning on a LLaMA backbone.

Patches are flattened p×p×C vectors embedded by one Linear; positions enter only through 1-D
rotary embeddings over the row-major token order (no absolute position table). Each layer is
a pre-RMSNorm LLaMA block (optional q/k LayerNorm for bf16 stability, grouped kv heads, SwiGLU)
modulated by c = t_emb + y_emb, whose width is capped at 1024. The output is the noise and,
with `learn_sigma`, the variance interpolation, as in DiT.
"""

import torch.nn as nn

from dit_trainer.models.dit.model import LabelEmbedder
from dit_trainer.models.dit.model import TimestepEmbedder as _DiTTimestepEmbedder
from dit_trainer.models.guidance import guided_forward
from dit_trainer.models.interval import add_interval, zero_interval_embedding
from dit_trainer.models.layers import set_io, unpatchify
from dit_trainer.models.large_dit.config import LargeDiTConfig, check_sizes
from dit_trainer.models.large_dit.layers import FinalLayer, TransformerBlock, cond_dim
from dit_trainer.models.large_dit.sizes import SIZES
from dit_trainer.models.routing import run_blocks
from dit_trainer.models.spec import build_kwargs
from dit_trainer.objective import takes_guidance_scale, takes_interval
from dit_trainer.repa.attach import aligned_depth, attach_projector, project


class TimestepEmbedder(_DiTTimestepEmbedder):
    """DiT's timestep embedder; the sinusoid is cast to the weights' dtype so the model also
    runs with bf16 parameters and no autocast, as the release does."""

    def forward(self, t):
        freq = self.timestep_embedding(t, self.frequency_embedding_size)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))


class DiT_Llama(nn.Module):
    """Diffusion transformer on a LLaMA backbone; arguments and parameter names are the release's."""

    def __init__(
        self,
        input_size=32,
        patch_size=2,
        in_channels=4,
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=None,
        multiple_of=256,
        ffn_dim_multiplier=None,
        norm_eps=1e-5,
        class_dropout_prob=0.1,
        num_classes=1000,
        learn_sigma=True,
        qk_norm=False,
        interval_embedding=False,
        guidance_embedding=False,
    ):
        super().__init__()
        set_io(self, input_size, patch_size, in_channels, num_classes, learn_sigma)
        self.dim, self.n_heads = dim, n_heads
        self.num_heads = n_heads  # the name DiT uses, for code that reads either family
        n_tokens = (input_size // patch_size) ** 2

        self.x_embedder = nn.Linear(patch_size * patch_size * in_channels, dim, bias=True)
        self.t_embedder = TimestepEmbedder(cond_dim(dim))
        self.y_embedder = LabelEmbedder(num_classes, cond_dim(dim), class_dropout_prob)
        self.layers = nn.ModuleList(
            TransformerBlock(i, dim, n_heads, n_kv_heads, multiple_of, ffn_dim_multiplier, norm_eps, qk_norm, n_tokens)
            for i in range(n_layers)
        )
        self.final_layer = FinalLayer(dim, patch_size, self.out_channels)
        if interval_embedding:  # MeanFlow's interval h = t - r (models/interval.py); absent otherwise
            self.h_embedder = TimestepEmbedder(cond_dim(dim))
        if guidance_embedding:  # improved MeanFlow's guidance scale as an input
            self.w_embedder = TimestepEmbedder(cond_dim(dim))
        self.init_weights()

    @property
    def blocks(self):
        """The repeated units under the name the pipeline contract uses (same modules as `layers`)."""
        return self.layers

    def __setattr__(self, name, value):
        # nn.Module would register `blocks = ...` as a second child behind the property's back;
        # a pipeline stage that keeps a slice of the blocks must replace `layers` instead.
        super().__setattr__("layers" if name == "blocks" else name, value)

    def __delattr__(self, name):
        super().__delattr__("layers" if name == "blocks" else name)

    def init_weights(self):
        """The release's initialisation: Xavier linears, N(0, 0.02) embedders, zeros wherever
        adaLN-Zero needs them; also recomputes the rotary tables (call after `to_empty`)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        zero_interval_embedding(self)
        for layer in self._iter_layers():
            nn.init.zeros_(layer.adaLN_modulation[-1].weight)
            nn.init.zeros_(layer.adaLN_modulation[-1].bias)
            layer.attention.reset_rope()
        for lin in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def _iter_layers(self):
        # A pipeline stage may hold its slice of layers as a ModuleDict keyed by global index.
        return self.layers.values() if isinstance(self.layers, nn.ModuleDict) else iter(self.layers)

    def patchify(self, x):
        """(B, C, H, W) -> (B, T, C·p·p): tokens row-major, features channel-major, as released."""
        b, c, h, w = x.shape
        if (h, w) != (self.input_size, self.input_size):
            raise ValueError(f"input is {(h, w)} but the model was built for {(self.input_size,) * 2}")
        p = self.patch_size
        x = x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.flatten(3).flatten(1, 2)

    def unpatchify(self, x):
        """(B, T, p·p·C_out) -> (B, C_out, H, W); output features are (p, p, C) ordered."""
        return unpatchify(x, self.patch_size, self.out_channels)

    def embed(self, x, t, y, force_drop_ids=None, h=None, w=None):
        """Input stage: patch tokens and the conditioning vector c = t_emb + y_emb (+ h_emb with an interval,
        + the guidance scale's with `guidance_embedding`)."""
        tokens = self.x_embedder(self.patchify(x))
        c = self.t_embedder(t) + self.y_embedder(y, self.training, force_drop_ids)
        return tokens, add_interval(self, c, t, h, w)

    def head(self, tokens, c):
        """Output stage: final adaLN layer and unpatchify."""
        return self.unpatchify(self.final_layer(tokens, c))

    def forward(self, x, t, y, force_drop_ids=None, route=None, repa=False, h=None, w=None):
        """x: (B, C, H, W), t: (B,), y: (B,) -> (B, out_channels, H, W).

        `force_drop_ids` (B,) marks labels to replace by the null class, drawn by the trainer.
        `route` (a `TokenRoute`, training only) sends a subset of the tokens through a span of
        layers, each token rotated by its own position. `repa` (a model built with repa.enabled)
        also returns the projected tokens of layer `repa_depth`: (output, projected). `h` (B,): MeanFlow's
        interval, for a model built with `interval_embedding` (None: 0); `w` (B,) the guidance scale, for one
        built with `guidance_embedding` (None: 1).
        """
        tokens, c = self.embed(x, t, y, force_drop_ids, h, w)
        route = route if self.training else None
        if repa:
            tokens, hidden = run_blocks(self._iter_layers(), tokens, c, route, rotary=True, capture=aligned_depth(self))
            return self.head(tokens, c), project(self, hidden)
        tokens = run_blocks(self._iter_layers(), tokens, c, route, rotary=True)
        return self.head(tokens, c)

    def forward_with_cfg(self, x, t, y, cfg_scale, cfg_channels=None):
        """Classifier-free guidance: the batch holds conditional then unconditional halves.

        Guidance applies to the first `cfg_channels` output channels, by default every
        predicted-noise channel (`in_channels`); the release guided the first three
        (`cfg_channels=3`), copied from DiT. The other channels (learned σ) pass through unguided.
        """
        return guided_forward(self.forward, x, t, y, cfg_scale, self.in_channels if cfg_channels is None else cfg_channels)


def _constructor(size, patch=2):
    dim, n_layers, n_heads = SIZES[size]

    def build(**kwargs):
        return DiT_Llama(**{"patch_size": patch, "dim": dim, "n_layers": n_layers, "n_heads": n_heads, **kwargs})

    build.__name__ = f"DiT_Llama_{size}_patch{patch}"
    build.__doc__ = f"LargeDiT-{size}/{patch}: dim {dim}, {n_layers} layers, {n_heads} heads, patch {patch}."
    return build


DiT_Llama_models = {f"LargeDiT-{size}/2": _constructor(size) for size in SIZES}
DiT_Llama_600M_patch2 = DiT_Llama_models["LargeDiT-600M/2"]
DiT_Llama_3B_patch2 = DiT_Llama_models["LargeDiT-3B/2"]
DiT_Llama_7B_patch2 = DiT_Llama_models["LargeDiT-7B/2"]


def build_large_dit(cfg, size):
    """A DiT_Llama of `size` from a Config, a ModelConfig or a mapping (family keys override)."""
    shared, family = build_kwargs(cfg, LargeDiTConfig)
    options = dict(vars(family))
    for key, value in zip(("dim", "n_layers", "n_heads"), SIZES[size]):
        if options[key] is None:  # None keeps the named size's value
            options[key] = value
    check_sizes(options["dim"], options["n_heads"], options["n_kv_heads"])
    return attach_projector(DiT_Llama(**shared, **options, interval_embedding=takes_interval(cfg),
                                    guidance_embedding=takes_guidance_scale(cfg)), cfg)
