"""What a Large-DiT (DiT-LLaMA) state dict says of its model through its tensors' shapes. Positions
are rotary, so no tensor holds the input size: the data gives it. Torch-free: it reads `.shape` only."""

from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.models.large_dit.sizes import SIZES, swiglu_hidden
from dit_trainer.models.spec import options_from_weights

_NEED = ("x_embedder.weight", "final_layer.linear.weight", "y_embedder.embedding_table.weight",
         "layers.0.attention.wk.weight", "layers.0.feed_forward.w1.weight")


def weights_shape(sd: dict, name, options: dict, source="weights") -> dict:
    """The model keys (`name`, shared fields, family options) a Large-DiT needs to take `sd`; a value
    the user set (`name`, `options`) that the tensors contradict is a one-line ConfigError."""
    missing = [k for k in _NEED if k not in sd]
    if missing:
        raise CheckpointError(f"{source} is not a Large-DiT state dict: it has no {', '.join(missing)}")
    dim, flat = (int(n) for n in sd["x_embedder.weight"].shape)
    patch = int(options.get("patch_size") or 2)
    if flat % (patch * patch):
        raise ConfigError(f"{source}: its patches hold {flat} values, not a multiple of {patch}x{patch}; set "
                          "model.patch_size to the one it was trained with")
    channels = flat // (patch * patch)
    out = int(sd["final_layer.linear.weight"].shape[0]) // (patch * patch)
    n_layers = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
    released = next((s for s, (d, n, _) in SIZES.items() if (d, n) == (dim, n_layers)), None)
    size = released or next((s for s, (d, _, _) in SIZES.items() if d == dim), None)
    heads = options.get("n_heads") or (SIZES[size][2] if size else None)
    if heads is None:
        raise ConfigError(f"{source}: a Large-DiT of width {dim} is no release width, so its head count is not "
                          "known; set model.n_heads to the one it was trained with")
    kv = int(sd["layers.0.attention.wk.weight"].shape[0]) // (dim // int(heads))
    want = {"dim": dim, "n_layers": n_layers, "n_heads": int(heads), "n_kv_heads": None if kv == heads else kv,
            "qk_norm": "layers.0.attention.q_norm.weight" in sd}
    hidden = int(sd["layers.0.feed_forward.w1.weight"].shape[0])
    multiplier = options.get("ffn_dim_multiplier")
    # The SwiGLU width is rounded up to multiple_of: the release's 256 first, then the smaller powers of two.
    rounding = [int(options["multiple_of"])] if options.get("multiple_of") else [256, 128, 64, 32, 16, 8, 4, 2, 1]
    multiple_of = next((m for m in rounding if swiglu_hidden(dim, m, multiplier) == hidden), None)
    if multiple_of is None:
        raise ConfigError(f"{source}: its SwiGLU is {hidden} wide, which model.multiple_of {rounding[0]} and "
                          f"model.ffn_dim_multiplier {multiplier} do not give; set them as trained")
    want["multiple_of"] = multiple_of
    given = name is not None
    if not given:
        name = f"LargeDiT-{size or next(iter(SIZES))}/2"
    base_size = next((s for s in SIZES if f"-{s}/" in str(name) or f"_{s}_" in str(name)), None)
    if released and base_size != released:
        raise ConfigError(f"model.name {name} does not fit {source}: its tensors are a LargeDiT-{released}/2 (dim {dim}, "
                          f"{n_layers} layers); leave model.name out or set it to that")
    base = dict(zip(("dim", "n_layers", "n_heads"), SIZES.get(base_size) or (None, None, None)), n_kv_heads=None,
                qk_norm=False, multiple_of=256)
    found = {"name": name, "in_channels": channels, "num_classes": int(sd["y_embedder.embedding_table.weight"].shape[0]) - 1,
             "learn_sigma": out == 2 * channels}
    return {**found, **options_from_weights(want, base, options, source, name if given else None)}
