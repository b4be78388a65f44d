"""Paddle's `.pdparams` without paddle: a pickle of parameter name -> numpy array.

Paddle stores a Linear's weight as [in, out], the transpose of torch's [out, in]; convolution
kernels, norms and embedding tables keep torch's layout. Reading goes through an unpickler that
rebuilds numpy arrays and nothing else, so a file cannot run code on load.
"""

import io
import pickle

import numpy as np
import torch

from dit_trainer.checkpoint.unpickle import PlainDataUnpickler
from dit_trainer.errors import CheckpointError, one_line
from dit_trainer.fs import check_regular

# The only globals a pickle of numpy arrays needs (numpy 1.x and 2.x module paths); `_codecs.encode`
# is how protocol 2 stores the arrays' raw bytes.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}
# Paddle writes this bookkeeping entry (structured name -> internal name) beside the arrays.
NAME_TABLE = "StructuredToParameterName@@"


class _ArraysOnly(PlainDataUnpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a numpy array type")

    def buildable(self) -> tuple:
        """Arrays and their dtypes (numpy fills both through its own __setstate__)."""
        return (np.ndarray, np.dtype)


def is_linear_weight(name: str, array) -> bool:
    """Whether a tensor is an nn.Linear weight (the ones paddle transposes): 2-D, not an embedding table."""
    return name.endswith(".weight") and array.ndim == 2 and "embedding" not in name


def to_paddle(sd: dict) -> dict:
    """name -> float32/… numpy array in paddle's layout from a torch state dict."""
    out = {}
    for name, tensor in sd.items():
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()  # numpy has no bfloat16
        array = tensor.detach().cpu().numpy()
        out[name] = np.ascontiguousarray(array.T if is_linear_weight(name, array) else array)
    return out


def from_paddle(arrays: dict) -> dict:
    """A torch state dict from paddle-layout arrays (the inverse of `to_paddle`)."""
    return {name: torch.from_numpy(np.ascontiguousarray(a.T if is_linear_weight(name, a) else a))
            for name, a in arrays.items()}


def save_pdparams(sd: dict, path) -> None:
    """Write a torch state dict as a paddle `.pdparams` (no paddle needed)."""
    arrays = to_paddle(sd)
    with open(path, "wb") as f:
        pickle.dump(arrays, f, protocol=4)


def load_pdparams(path) -> dict:
    """A torch state dict from a `.pdparams`, refusing anything but a mapping of names to numeric arrays."""
    check_regular(path, CheckpointError, "a .pdparams")
    try:
        with open(path, "rb") as f:
            obj = _ArraysOnly(io.BytesIO(f.read())).load()
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{path}: refused, it holds more than numpy arrays ({one_line(err)}); "
                              "re-save it with paddle.save(model.state_dict())") from None
    except Exception as err:
        raise CheckpointError(f"{path}: cannot be read as a .pdparams ({type(err).__name__}: {one_line(err)})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a mapping of parameter names to arrays")
    obj.pop(NAME_TABLE, None)
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, np.ndarray) or v.dtype.hasobject]
    if bad:
        raise CheckpointError(f"{path}: entry {bad[0]!r} is not a numeric array; a .pdparams holds arrays only")
    return from_paddle(obj)
