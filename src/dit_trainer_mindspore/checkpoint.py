"""MindSpore `.ckpt` files: weights (what `dit convert` writes) and full training state.

A training checkpoint holds the model under its own names, the EMA as `ema.<name>`, AdamW's
moments as `adamw.exp_avg.<name>` and `adamw.exp_avg_sq.<name>`, and the
step in `append_dict`: with the (seed, step)-keyed draws that is all an exact resume needs.
"""

import glob
import os

import mindspore as ms
from mindspore import Tensor

from dit_trainer.errors import CheckpointError
from dit_trainer_mindspore.ckpt_file import read_weights, save_weights  # noqa: F401 (also this module's API)
from dit_trainer_mindspore.convert import read, torch_to_mindspore


def load_weights(model, path) -> None:
    """Load weights into `model`, strictly (every name, every shape): a MindSpore `.ckpt`, or, converted
    on the fly, our checkpoint dir / `.safetensors` or a facebookresearch/DiT `.pt` (`model.weights_path`)."""
    path = str(path)
    if path.endswith(".ckpt"):
        weights = read_weights(path)
    else:
        fmt = "ours" if os.path.isdir(path) or path.endswith(".safetensors") else "dit-pt"
        weights = torch_to_mindspore(read(path, fmt), source=path)
    own = dict(model.parameters_and_names())
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}; "
                              f"check model.name and the size options")
    for name, p in own.items():
        if tuple(weights[name].shape) != tuple(p.shape):
            raise CheckpointError(f"{path}: {name} is {weights[name].shape}, the model wants {p.shape}")
        p.set_data(Tensor(weights[name]))


def save_state(engine, path) -> str:
    """Model, EMA, AdamW moments and step of `engine` in one .ckpt (written then renamed)."""
    params = list(engine.all_params) + list(engine.ema) + list(engine.exp_avg) + list(engine.exp_avg_sq)
    entries = [{"name": p.name, "data": p.value()} for p in params]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # A hidden name that still ends in .ckpt (MindSpore appends the suffix otherwise) and that
    # latest() does not match, so an interrupted write never looks like a checkpoint.
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), "." + os.path.basename(path))
    ms.save_checkpoint(entries, tmp, append_dict={"step": int(engine.step)})
    os.replace(tmp, path)
    return str(path)


def load_state(engine, path) -> None:
    """Restore what `save_state` wrote into `engine`."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} does not exist; pass a .ckpt written by MindSporeTrainer.save_checkpoint")
    saved = ms.load_checkpoint(str(path))
    if "step" not in saved:
        raise CheckpointError(f"{path} has no step; it is a weights file, set model.weights_path to it instead")
    params = list(engine.all_params) + list(engine.ema) + list(engine.exp_avg) + list(engine.exp_avg_sq)
    missing = [p.name for p in params if p.name not in saved]
    if missing:
        raise CheckpointError(f"{path} lacks {missing[:3]}; it was written for another model or config")
    for p in params:
        p.set_data(Tensor(saved[p.name].asnumpy()))
    step = saved["step"]
    engine.step = int(step.asnumpy()) if hasattr(step, "asnumpy") else int(step)


def latest(output_dir):
    """The newest `step-XXXXXXXX.ckpt` in `output_dir/checkpoints`, or None."""
    files = sorted(glob.glob(os.path.join(output_dir, "checkpoints", "step-*.ckpt")))
    return files[-1] if files else None
