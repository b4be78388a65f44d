"""The post-hoc EMA profiles' place in a checkpoint (`train.phema_stds`).

The tracker (`dit_trainer.phema.PowerEMA`) hands its state over as {label: {FQN: tensor}}, one entry per
profile, and takes it back the same way; checkpoints store it without knowing more. Full checkpoints
hold it in `phema.safetensors` as `<label>/<FQN>` (labels and FQNs hold no "/"); sharded ones keep it
in the DCP state under `phema`, resharded like the EMA.
"""

PHEMA_FILE = "phema.safetensors"


def flatten(state: dict) -> dict:
    """{label: {FQN: tensor}} -> {"label/FQN": tensor}, for one safetensors file."""
    return {f"{label}/{name}": value for label, profile in state.items() for name, value in profile.items()}


def nest(flat: dict) -> dict:
    """The inverse of `flatten`."""
    out = {}
    for key, value in flat.items():
        label, _, name = key.partition("/")
        out.setdefault(label, {})[name] = value
    return out
