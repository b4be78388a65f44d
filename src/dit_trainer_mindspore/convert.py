"""Weights between PyTorch (ours / the facebookresearch/DiT release) and MindSpore `.ckpt`.

The parameter names of both backends are the release's, so the map is generated from the names
and shapes of a named size (`name_map("DiT-XL/2")` has the RFC's 292 tensors) and conversion
checks every name and shape against it. Arrays move as numpy, so `ours` (safetensors) and
`mindspore` need no torch; only reading or writing a `.pt` (`dit-pt`) imports torch.

    python -m dit_trainer_mindspore.convert --from ours|dit-pt --to mindspore IN OUT.ckpt
    python -m dit_trainer_mindspore.convert --from mindspore --to ours|dit-pt IN.ckpt OUT
"""

import argparse
import importlib.util
import os
import sys

import numpy as np

from dit_trainer.errors import CheckpointError, ConfigError, DitError
from dit_trainer.models.dit.config import block_options, refuse_block_options
from dit_trainer.models.dit.sizes import dit_size
from dit_trainer.models.dit.weights_shape import block_options_of

FORMATS = ("ours", "dit-pt", "mindspore")
_WRAPPERS = ("module.", "_orig_mod.")


def name_map(model_name="DiT-XL/2", input_size=32, in_channels=4, num_classes=1000, learn_sigma=True,
             class_dropout_prob=0.1, mlp_ratio=4.0, **overrides) -> dict:
    """{PyTorch name: (MindSpore name, shape)} of a DiT size, in the models' parameter order."""
    s = {**dit_size(model_name), **{k: v for k, v in overrides.items() if v is not None}}
    d, p, depth = s["hidden_size"], s["patch_size"], s["depth"]
    out_c = in_channels * (2 if learn_sigma else 1)
    mlp = int(d * mlp_ratio)
    shapes = [("pos_embed", (1, (input_size // p) ** 2, d)),
              ("x_embedder.proj.weight", (d, in_channels, p, p)), ("x_embedder.proj.bias", (d,)),
              ("t_embedder.mlp.0.weight", (d, 256)), ("t_embedder.mlp.0.bias", (d,)),
              ("t_embedder.mlp.2.weight", (d, d)), ("t_embedder.mlp.2.bias", (d,)),
              ("y_embedder.embedding_table.weight", (num_classes + int(class_dropout_prob > 0), d))]
    for i in range(depth):
        for name, shape in (("attn.qkv", (3 * d, d)), ("attn.proj", (d, d)), ("mlp.fc1", (mlp, d)),
                            ("mlp.fc2", (d, mlp)), ("adaLN_modulation.1", (6 * d, d))):
            shapes += [(f"blocks.{i}.{name}.weight", shape), (f"blocks.{i}.{name}.bias", (shape[0],))]
    for name, shape in (("linear", (p * p * out_c, d)), ("adaLN_modulation.1", (2 * d, d))):
        shapes += [(f"final_layer.{name}.weight", shape), (f"final_layer.{name}.bias", (shape[0],))]
    # Same names on both sides: MindSpore Cells mirror the torch module tree (see model.py).
    return {name: (name, shape) for name, shape in shapes}


def infer_size(weights: dict) -> dict:
    """name_map() keyword arguments that fit a DiT state dict (hidden, depth, patch, classes, ...)."""
    try:
        d_, c, p, _ = weights["x_embedder.proj.weight"].shape
        n = weights["pos_embed"].shape[1]
        depth = len({k.split(".")[1] for k in weights if k.startswith("blocks.")})
        rows = weights["y_embedder.embedding_table.weight"].shape[0]
        out = weights["final_layer.linear.weight"].shape[0] // (p * p)
        mlp = weights["blocks.0.mlp.fc1.weight"].shape[0] if depth else 4 * d_
    except (KeyError, ValueError) as err:
        raise CheckpointError(f"not a DiT state dict ({err} missing or misshapen)") from None
    # Heads do not show in the shapes; the map needs none. The label table's rows (classes plus the
    # null row) are taken as num_classes with no dropout row, which gives the same shape.
    return {"model_name": "DiT-S/2", "hidden_size": d_, "depth": depth, "patch_size": p,
            "input_size": int(round(n ** 0.5)) * p, "in_channels": c, "learn_sigma": out == 2 * c,
            "num_classes": rows, "class_dropout_prob": 0.0, "mlp_ratio": mlp / d_}


def _check(weights: dict, mapping: dict, source) -> None:
    missing = [k for k in mapping if k not in weights]
    unexpected = [k for k in weights if k not in mapping]
    wrong = [k for k, (_, shape) in mapping.items() if k in weights and tuple(weights[k].shape) != tuple(shape)]
    if missing or unexpected or wrong:
        raise CheckpointError(f"{source} does not fit the DiT map: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                              f"wrong shape {wrong[:3]}; check --model and the size options")


def _mapping_for(weights: dict, model_name=None, **kwargs) -> dict:
    if model_name is None:
        return name_map(**infer_size(weights))
    return name_map(model_name, **kwargs)


def torch_to_mindspore(weights: dict, model_name=None, source="weights", **kwargs) -> dict:
    """{name: float32 array} in MindSpore names from a PyTorch DiT state dict (ours or the release)."""
    weights = {_strip(k): np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    refuse_block_options(block_options_of(weights), "MindSpore's DiT", source)
    mapping = _mapping_for(weights, model_name, **kwargs)
    _check(weights, mapping, source)
    return {ms_name: weights[name] for name, (ms_name, _) in mapping.items()}


def mindspore_to_torch(weights: dict, model_name=None, source="weights", **kwargs) -> dict:
    """{name: float32 array} in PyTorch names from MindSpore DiT weights."""
    mapping = _mapping_for(weights, model_name, **kwargs)
    back = {ms_name: name for name, (ms_name, _) in mapping.items()}
    _check({back.get(k, k): v for k, v in weights.items()}, mapping, source)
    return {back[k]: np.asarray(v, dtype=np.float32) for k, v in weights.items()}


def _recorded_block_options(src) -> dict:
    """The block options a checkpoint folder's config.yaml records (RoPE shows in no tensor); {} elsewhere."""
    path = os.path.join(src, "config.yaml")
    if not os.path.isfile(path):
        return {}
    import yaml

    with open(path) as f:
        return block_options((yaml.safe_load(f) or {}).get("model") or {})


def _strip(key: str) -> str:
    for prefix in _WRAPPERS:
        key = key.removeprefix(prefix)
    return key


def read(path, fmt) -> dict:
    """{name: numpy array} from a file (or our checkpoint dir) in format `fmt`."""
    if fmt == "mindspore":
        from dit_trainer_mindspore.ckpt_file import read_weights

        return read_weights(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path} does not exist; pass a checkpoint directory, .safetensors, .pt or .ckpt file")
    if os.path.isdir(path):
        for name in ("ema.safetensors", "model.safetensors"):
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise CheckpointError(f"{path} holds no ema.safetensors or model.safetensors; is it a dit-trainer checkpoint?")
    if str(path).endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(str(path))
    import torch  # a .pt needs torch; weights_only keeps it a plain tensor load

    obj = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and isinstance(obj.get("ema"), dict):
        obj = obj["ema"]
    elif isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors")
    return {k: v.float().numpy() for k, v in obj.items()}


def write(weights: dict, path, fmt) -> str:
    """Write {name: array} to `path` in format `fmt` (mindspore .ckpt, ours .safetensors, dit-pt .pt)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    if fmt == "mindspore":
        from dit_trainer_mindspore.ckpt_file import save_weights

        return save_weights(weights, path)
    if fmt == "ours":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(path))
        return str(path)
    import torch

    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}, str(path))
    return str(path)


def convert(src, dst, src_fmt, dst_fmt, model_name=None, **kwargs) -> int:
    """Convert the DiT weights at `src` into `dst`; returns the number of tensors written."""
    if src_fmt not in FORMATS or dst_fmt not in FORMATS or (src_fmt == "mindspore") == (dst_fmt == "mindspore"):
        raise CheckpointError(f"convert between mindspore and one of ours, dit-pt (got --from {src_fmt} --to {dst_fmt})")
    if importlib.util.find_spec("mindspore") is None:
        raise ConfigError("converting to or from mindspore needs MindSpore: pip install 'dit-trainer[mindspore]' "
                          "in an environment with numpy<2 (scripts/mindspore_env.sh)")
    weights = read(src, src_fmt)
    if dst_fmt == "mindspore":
        refuse_block_options(_recorded_block_options(src), "MindSpore's DiT", src)
        out = torch_to_mindspore(weights, model_name, source=src, **kwargs)
    else:
        out = mindspore_to_torch(weights, model_name, source=src, **kwargs)
    write(out, dst, dst_fmt)
    return len(out)


def main(argv=None) -> int:
    """`python -m dit_trainer_mindspore.convert --from F --to G IN OUT [--model DiT-XL/2]`."""
    ap = argparse.ArgumentParser(prog="python -m dit_trainer_mindspore.convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src_fmt", required=True, choices=FORMATS)
    ap.add_argument("--to", dest="dst_fmt", required=True, choices=FORMATS)
    ap.add_argument("--model", default=None, help="check against this size (default: inferred from the shapes)")
    ap.add_argument("--input-size", type=int, default=32)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args(argv)
    kwargs = {"input_size": args.input_size, "num_classes": args.num_classes} if args.model else {}
    try:
        n = convert(args.src, args.dst, args.src_fmt, args.dst_fmt, args.model, **kwargs)
    except DitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {n} tensors to {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
