"""PixArt-alpha: Fast Training of Diffusion Transformer for Photorealistic Text-to-Image Synthesis
(Chen et al., 2023), and PixArt-Sigma (Chen et al., 2024), which keeps its backbone.

A PixArt is DiT-XL/2 made text-conditional (paper, section 2.3):
- a cross-attention layer in every block, between self-attention and the MLP, whose queries are the
  image tokens and whose keys and values are the caption's tokens, padding masked out;
- the caption's token embeddings (T5-XXL's) projected to the model's width by a two-layer MLP
  (`y_embedder`, the caption projection);
- adaLN-single: one MLP (`t_block`) maps the timestep embedding to the six modulation vectors shared
  by all blocks, and each block adds its own learned `scale_shift_table` (its E(i)), instead of
  DiT's per-block adaLN MLPs of the class and timestep;
- at 1024 px (PixArt-alpha), micro-conditions: the image's resolution and aspect ratio embedded like
  timesteps and added to the timestep embedding (SDXL's idea).
Trained as MeanFlow, the interval h (and, with a range of guidance scales, the scale w) are embedded the same
way and added to the timestep embedding before adaLN-single (`models/interval.py`; absent otherwise).
There is no class embedding, and no learned null caption: a dropped caption is the text encoder's
encoding of "" (`dit_trainer.condition.text`). Module and parameter names are the release's
(PixArt-alpha's `PixArt.py`/`PixArtMS.py`), so its checkpoints load by name.
"""

import torch
import torch.nn as nn

from dit_trainer.models.attention import attention
from dit_trainer.models.dit.model import TimestepEmbedder
from dit_trainer.models.guidance import guided_forward
from dit_trainer.models.interval import add_interval, zero_interval_embedding
from dit_trainer.models.layers import Attention, Mlp, PatchEmbed, init_backbone, set_io, unpatchify
from dit_trainer.repa.attach import aligned_depth, project

TEXT_KEYS = ("text_embeds", "text_mask")
MICRO_KEYS = ("resolution", "aspect_ratio")


def t2i_modulate(x, shift, scale):
    """adaLN-single's modulation: shift and scale are (B, 1, D), already the block's own."""
    return x * (1 + scale) + shift


class CaptionEmbedder(nn.Module):
    """The caption projection: the text encoder's token embeddings to the model's width."""

    def __init__(self, caption_channels, hidden_size):
        super().__init__()
        self.y_proj = Mlp(caption_channels, hidden_size, hidden_size)

    def forward(self, caption):
        return self.y_proj(caption)


class SizeEmbedder(TimestepEmbedder):
    """A micro-condition (B, dims) embedded value by value like a timestep, then concatenated: (B, dims * width)."""

    def forward(self, s):
        b, dims = s.shape[0], s.reshape(s.shape[0], -1).shape[1]
        return super().forward(s.reshape(-1)).reshape(b, dims * self.mlp[-1].out_features)


class MultiHeadCrossAttention(nn.Module):
    """Image tokens attend to the caption's tokens; `kv_linear`'s output rows are laid out [k | v]."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"hidden size {d_model} is not divisible by num_heads {num_heads}")
        self.head_dim = d_model // num_heads
        self.q_linear = nn.Linear(d_model, d_model)
        self.kv_linear = nn.Linear(d_model, d_model * 2)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, cond, mask=None):
        """x (B, N, D), cond (B, L, D), mask (B, 1, 1, L) True for the caption's tokens, or None."""
        # Heads read off the tensors: under tensor parallelism each rank holds only its own.
        q = self.q_linear(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
        k, v = self.kv_linear(cond).unflatten(-1, (2, -1, self.head_dim)).permute(2, 0, 3, 1, 4).unbind(0)
        out = attention(q, k, v, mask=mask)
        return self.proj(out.transpose(1, 2).flatten(2))


class PixArtBlock(nn.Module):
    """Self-attention, cross-attention to the caption, MLP; the first and last modulated by adaLN-single."""

    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.cross_attn = MultiHeadCrossAttention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        # E(i): this block's own offset of the six vectors t_block computes for every block.
        self.scale_shift_table = nn.Parameter(torch.randn(6, hidden_size) / hidden_size**0.5)

    def forward(self, x, y, t, mask=None):
        """x (B, N, D) image tokens, y (B, L, D) projected caption, t (B, 6D) t_block's output."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.scale_shift_table[None] + t.reshape(x.shape[0], 6, -1)).chunk(6, dim=1)
        x = x + gate_msa * self.attn(t2i_modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + self.cross_attn(x, y, mask)
        x = x + gate_mlp * self.mlp(t2i_modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class T2IFinalLayer(nn.Module):
    """The last LayerNorm, modulated by the timestep embedding plus a learned table, and the patch head."""

    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden_size) / hidden_size**0.5)

    def forward(self, x, t):
        shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
        return self.linear(t2i_modulate(self.norm_final(x), shift, scale))


class PixArt(nn.Module):
    """Diffusion transformer conditioned on a caption's token embeddings by cross-attention."""

    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                 mlp_ratio=4.0, caption_channels=4096, learn_sigma=True, interpolation_scale=1.0,
                 micro_conditions=False, interval_embedding=False, guidance_embedding=False):
        super().__init__()
        set_io(self, input_size, patch_size, in_channels, 0, learn_sigma)
        self.num_heads, self.interpolation_scale = num_heads, float(interpolation_scale)
        self.micro_conditions, self.caption_channels = bool(micro_conditions), caption_channels
        # The keyword arguments the model takes from a batch (the text condition reads these keys).
        self.condition_keys = TEXT_KEYS + (MICRO_KEYS if self.micro_conditions else ())

        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))
        self.y_embedder = CaptionEmbedder(caption_channels, hidden_size)
        if self.micro_conditions:
            self.csize_embedder = SizeEmbedder(hidden_size // 3)  # height and width: 2/3 of the width
            self.ar_embedder = SizeEmbedder(hidden_size // 3)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList([PixArtBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth)])
        self.final_layer = T2IFinalLayer(hidden_size, patch_size, self.out_channels)
        if interval_embedding:  # MeanFlow's interval h = t - r; absent otherwise, so the state dict is the release's
            self.h_embedder = TimestepEmbedder(hidden_size)
        if guidance_embedding:  # improved MeanFlow's guidance scale
            self.w_embedder = TimestepEmbedder(hidden_size)
        self.initialize_weights()

    def initialize_weights(self):
        """The release's: Xavier linears, sin-cos positions, N(0, 0.02) embedder MLPs, and zeros for each
        cross-attention's output and the head, so a new block adds no caption and the model starts at 0."""
        init_backbone(self, self.interpolation_scale)
        embedders = [self.t_embedder, *([self.csize_embedder, self.ar_embedder] if self.micro_conditions else [])]
        for embedder in embedders:
            nn.init.normal_(embedder.mlp[0].weight, std=0.02)
            nn.init.normal_(embedder.mlp[2].weight, std=0.02)
        nn.init.normal_(self.t_block[1].weight, std=0.02)
        nn.init.normal_(self.y_embedder.y_proj.fc1.weight, std=0.02)
        nn.init.normal_(self.y_embedder.y_proj.fc2.weight, std=0.02)
        for block in self.blocks:
            nn.init.constant_(block.cross_attn.proj.weight, 0)
            nn.init.constant_(block.cross_attn.proj.bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)
        zero_interval_embedding(self)

    def embed_timestep(self, t, resolution=None, aspect_ratio=None, h=None, w=None):
        """The timestep embedding (B, D), with the micro-conditions' added where the model has them, and
        MeanFlow's interval h and guidance scale w where it embeds them."""
        t_emb = add_interval(self, self.t_embedder(t), t, h, w)
        if not self.micro_conditions:
            return t_emb
        if resolution is None or aspect_ratio is None:
            raise ValueError("this PixArt takes micro-conditions: pass resolution (B, 2) and aspect_ratio (B, 1)")
        return t_emb + torch.cat([self.csize_embedder(resolution), self.ar_embedder(aspect_ratio)], dim=1)

    def forward(self, x, t, text_embeds, text_mask=None, resolution=None, aspect_ratio=None, h=None, w=None,
                repa=False):
        """x: (B, C, H, W) latents, t: (B,) timesteps, text_embeds: (B, L, caption_channels) the text
        encoder's last hidden states, text_mask: (B, L) 1 for the caption's tokens -> (B, out_channels, H, W).

        `resolution` (B, 2) (height, width in pixels) and `aspect_ratio` (B, 1) for a model with
        micro-conditions. Dropped captions arrive already replaced by the null caption's encoding. `h` (B,):
        MeanFlow's interval t - r and `w` (B,) its guidance scale, for a model built to embed them. `repa` (a
        model built with repa.enabled) also returns the projected tokens of block `repa_depth`: (output, projected).
        """
        tokens = self.x_embedder(x) + self.pos_embed
        t_emb = self.embed_timestep(t, resolution, aspect_ratio, h, w)
        t_mod = self.t_block(t_emb)  # adaLN-single: one MLP for every block
        y = self.y_embedder(text_embeds)
        mask = None if text_mask is None else text_mask.bool()[:, None, None, :]
        depth = aligned_depth(self) if repa else None
        for i, block in enumerate(self.blocks, 1):
            tokens = block(tokens, y, t_mod, mask)
            if i == depth:
                hidden = tokens
        out = unpatchify(self.final_layer(tokens, t_emb), self.patch_size, self.out_channels)
        return (out, project(self, hidden)) if repa else out

    def forward_with_cfg(self, x, t, cfg_scale, cfg_channels=None, **cond):
        """Classifier-free guidance on a batch whose first half is conditional and second half unconditional
        (`cond`: `Condition.guidance_kwargs`'s doubled keyword arguments), as DiT's `forward_with_cfg`."""
        channels = self.in_channels if cfg_channels is None else cfg_channels
        return guided_forward(lambda x2, t2, _: self.forward(x2, t2, **cond), x, t, None, cfg_scale, channels)


def build_pixart(options: dict, input_size, in_channels, learn_sigma, interval_embedding=False,
                 guidance_embedding=False) -> PixArt:
    """A PixArt of resolved options (`PixArtConfig.resolved`) and the shared shape fields; `interval_embedding`
    and `guidance_embedding` where its objective (MeanFlow) asks for them."""
    options = dict(options)
    caption_channels = options.pop("text_hidden_size")  # the config's generic name for PixArt's caption_channels
    return PixArt(input_size=input_size, in_channels=in_channels, learn_sigma=learn_sigma,
                  caption_channels=caption_channels, interval_embedding=interval_embedding,
                  guidance_embedding=guidance_embedding, **options)
