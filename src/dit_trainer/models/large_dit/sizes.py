"""Large-DiT's named sizes as plain data, free of torch: (dim, n_layers, n_heads) of the
release's three sizes, all with 2x2 patches."""

SIZES = {"600M": (1536, 16, 32), "3B": (3072, 32, 32), "7B": (4096, 32, 32)}


def swiglu_hidden(dim, multiple_of, ffn_dim_multiplier=None):
    """LLaMA's SwiGLU width: 2/3 of 4·dim (same parameters as a 4·dim MLP), times the
    multiplier, rounded up to `multiple_of`."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)
