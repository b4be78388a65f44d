"""Large-DiT's named sizes as plain data, free of torch: (dim, n_layers, n_heads) of the
release's three sizes, all with 2x2 patches."""

SIZES = {"600M": (1536, 16, 32), "3B": (3072, 32, 32), "7B": (4096, 32, 32)}
