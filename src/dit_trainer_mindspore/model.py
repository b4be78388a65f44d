"""DiT as MindSpore Cells with the parameter names of `dit_trainer.models.dit` (and of the
facebookresearch/DiT release), so a PyTorch state dict converts by name alone.

Layers are written out (no nn.Dense/nn.LayerNorm) so that every parameter name, shape and the
order of the arithmetic match the PyTorch modules: Linear weights are (out, in), the patch
convolution is (D, C, p, p), the label table is `y_embedder.embedding_table.weight`.
"""

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


def _param(array, name, requires_grad=True):
    return Parameter(Tensor(np.asarray(array, dtype=np.float32)), name=name, requires_grad=requires_grad)


class Linear(nn.Cell):
    """y = x W^T + b with torch's (out, in) weight layout."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = _param(np.zeros((out_features, in_features)), "weight")
        self.bias = _param(np.zeros(out_features), "bias")

    def construct(self, x):
        return ops.matmul(x, self.weight.T) + self.bias


class LayerNorm(nn.Cell):
    """LayerNorm over the last dim without affine parameters (DiT's eps 1e-6)."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def construct(self, x):
        mean = x.mean(-1, keep_dims=True)
        var = ((x - mean) ** 2).mean(-1, keep_dims=True)
        return (x - mean) / ops.sqrt(var + self.eps)


class SiLU(nn.Cell):
    def construct(self, x):
        return x * ops.sigmoid(x)


class PatchEmbed(nn.Cell):
    """Image to patch tokens: a strided convolution, then (B, N, D)."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Cell()
        self.proj.weight = _param(np.zeros((embed_dim, in_chans, patch_size, patch_size)), "weight")
        self.proj.bias = _param(np.zeros(embed_dim), "bias")
        self.patch_size = patch_size

    def construct(self, x):
        y = ops.conv2d(x, self.proj.weight, self.proj.bias, stride=self.patch_size)
        b, d = y.shape[0], y.shape[1]
        return y.reshape(b, d, -1).transpose(0, 2, 1)


class Attention(nn.Cell):
    """Multi-head self-attention with a fused `qkv` projection laid out [q | k | v]."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = Linear(dim, dim * 3)
        self.proj = Linear(dim, dim)

    def construct(self, x):
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale, axis=-1)
        out = ops.matmul(attn, v).transpose(0, 2, 1, 3).reshape(b, n, -1)
        return self.proj(out)


class Mlp(nn.Cell):
    """Two-layer MLP with tanh-approximated GELU, as in DiT."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)

    def construct(self, x):
        return self.fc2(ops.gelu(self.fc1(x), approximate="tanh"))


def timestep_embedding(t, dim, max_period=10000):
    """Sinusoidal embedding of timesteps, cos half first as in DiT."""
    half = dim // 2
    freqs = ops.exp(-math.log(max_period) * ops.arange(0, half, dtype=ms.float32) / half)
    args = t.astype(ms.float32)[:, None] * freqs[None]
    emb = ops.cat([ops.cos(args), ops.sin(args)], axis=-1)
    if dim % 2:
        emb = ops.cat([emb, ops.zeros_like(emb[:, :1])], axis=-1)
    return emb


class TimestepEmbedder(nn.Cell):
    def __init__(self, hidden, freq_dim=256):
        super().__init__()
        self.mlp = nn.SequentialCell(Linear(freq_dim, hidden), SiLU(), Linear(hidden, hidden))
        self.freq_dim = freq_dim

    def construct(self, t):
        return self.mlp(timestep_embedding(t, self.freq_dim))


class LabelEmbedder(nn.Cell):
    """Class table with the null class at row `num_classes` when labels can be dropped."""

    def __init__(self, num_classes, hidden, dropout_prob):
        super().__init__()
        rows = num_classes + int(dropout_prob > 0)
        self.embedding_table = nn.Cell()
        self.embedding_table.weight = _param(np.zeros((rows, hidden)), "weight")
        self.num_classes = num_classes

    def construct(self, labels, drop_ids):
        # The trainer always passes its drawn mask (zeros at evaluation): one code path.
        labels = ops.where(drop_ids == 1, ops.full_like(labels, self.num_classes), labels)
        return ops.gather(self.embedding_table.weight, labels, 0)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Cell):
    def __init__(self, hidden, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = LayerNorm()
        self.attn = Attention(hidden, num_heads)
        self.norm2 = LayerNorm()
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.SequentialCell(SiLU(), Linear(hidden, 6 * hidden))

    def construct(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ops.chunk(self.adaLN_modulation(c), 6, 1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Cell):
    def __init__(self, hidden, patch_size, out_channels):
        super().__init__()
        self.norm_final = LayerNorm()
        self.linear = Linear(hidden, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.SequentialCell(SiLU(), Linear(hidden, 2 * hidden))

    def construct(self, x, c):
        shift, scale = ops.chunk(self.adaLN_modulation(c), 2, 1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


def _sincos_1d(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    """Fixed 2-D sin-cos positions, the same numpy recipe as `dit_trainer.models.layers`."""
    grid = np.arange(grid_size, dtype=np.float32)
    mesh = np.stack(np.meshgrid(grid, grid), axis=0).reshape(2, 1, grid_size, grid_size)
    return np.concatenate([_sincos_1d(embed_dim // 2, mesh[0]), _sincos_1d(embed_dim // 2, mesh[1])], axis=1)


class DiT(nn.Cell):
    """Diffusion transformer: construct(x, t, y, drop_ids) -> (B, out_channels, H, W)."""

    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                 mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=1000, learn_sigma=True, seed=0):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.input_size = input_size
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        grid = input_size // patch_size
        self.pos_embed = _param(get_2d_sincos_pos_embed(hidden_size, grid)[None], "pos_embed", requires_grad=False)
        self.blocks = nn.CellList([DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights(seed)

    def initialize_weights(self, seed=0):
        """DiT's init from a seeded numpy generator: Xavier linears, N(0, 0.02) tables, adaLN-Zero."""
        rng = np.random.default_rng(seed)
        for name, p in self.parameters_and_names():
            shape = p.shape
            if name.endswith("pos_embed"):
                continue
            if name.endswith("bias") or "adaLN_modulation" in name or name.startswith("final_layer.linear"):
                value = np.zeros(shape)
            elif name == "y_embedder.embedding_table.weight" or name.startswith("t_embedder.mlp"):
                value = rng.normal(0.0, 0.02, shape)
            else:
                fan_out, fan_in = shape[0], int(np.prod(shape[1:]))
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                value = rng.uniform(-bound, bound, shape)
            p.set_data(Tensor(value.astype(np.float32)))

    def unpatchify(self, x):
        c, p = self.out_channels, self.patch_size
        h = w = int(round(x.shape[1] ** 0.5))
        x = x.reshape(x.shape[0], h, w, p, p, c).transpose(0, 5, 1, 3, 2, 4)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def construct(self, x, t, y, drop_ids):
        tokens = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y, drop_ids)
        for block in self.blocks:
            tokens = block(tokens, c)
        return self.unpatchify(self.final_layer(tokens, c))


def build_dit(**kwargs) -> DiT:
    """A DiT from `core.model_kwargs(cfg)` (depth, hidden_size, num_heads, patch_size, ...)."""
    return DiT(**kwargs)
