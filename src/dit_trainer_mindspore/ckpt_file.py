"""A MindSpore `.ckpt` file as named arrays: what the trainer's checkpoints and `convert` both read
and write."""

import os

import mindspore as ms
from mindspore import Tensor

from dit_trainer.errors import CheckpointError


def save_weights(named: dict, path) -> str:
    """Write {name: numpy array or Tensor} as a .ckpt; returns the path."""
    if not str(path).endswith(".ckpt"):
        raise CheckpointError(f"{path}: a MindSpore checkpoint must end in .ckpt; name it {path}.ckpt")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ms.save_checkpoint([{"name": k, "data": Tensor(v) if not isinstance(v, Tensor) else v} for k, v in named.items()],
                       str(path))
    return str(path)


def read_weights(path) -> dict:
    """{name: numpy array} of a .ckpt; CheckpointError if it cannot be read."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} does not exist; pass a .ckpt written by `dit convert` or training")
    try:
        params = ms.load_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as err:
        raise CheckpointError(f"cannot read {path} as a MindSpore checkpoint ({str(err).splitlines()[0]})") from None
    return {k: v.asnumpy() for k, v in params.items() if hasattr(v, "asnumpy")}
