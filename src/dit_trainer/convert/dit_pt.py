"""`dit-pt`: a facebookresearch/DiT release file (`DiT-XL-2-256x256.pt`) or its training dict
(`{"model", "ema", "opt", "args"}`, EMA preferred), read with `torch.load(weights_only=True)`.

The file holds tensors only; the model's size is read off their shapes unless `--model` names it
(a size name, or a model config file such as PaddleMIX's DiT JSON).
"""

from pathlib import Path

from dit_trainer.convert.model_bundle import Bundle
from dit_trainer.convert.model_config import check_fits, infer_from_state_dict, tensor_shape
from dit_trainer.errors import CheckpointError
from dit_trainer.config.model_file import is_model_file, load_model_file


def read(src, model=None, num_heads=None, vae=None) -> Bundle:
    """A Bundle from a released DiT `.pt` (or `.safetensors`); `model` is a size name like DiT-XL/2 or a
    model config file (PaddleMIX DiT JSON, our YAML)."""
    from dit_trainer import checkpoint

    path = Path(src)
    if not path.is_file():
        raise CheckpointError(f"{src} is not a file; --from dit-pt takes a DiT .pt (or .safetensors) file")
    sd = checkpoint.open(path).weights("ema")
    if model and num_heads:
        raise CheckpointError(f"--model {model} gives the head count; drop --num-heads {num_heads}")
    if model and is_model_file(model):
        # The file says all the tensors do not (the heads); check_fits compares the two.
        cfg = {k: v for k, v in load_model_file(model).items() if k not in ("weights_path", "config_file")}
    elif model:
        cfg = _named(tensor_shape(sd, path.name), model)
    else:
        cfg = infer_from_state_dict(sd, path.name, num_heads)
    check_fits(sd, cfg, path.name)
    # The release's latents come from SD's VAE at 0.18215; the 512 model is 64x64 latents.
    return Bundle(state_dict=sd, model=cfg, vae=vae or "stabilityai/sd-vae-ft-mse", scaling_factor=0.18215,
                  class_names=None, source=str(path))


def _named(shape, name):
    """The config of size `name` with the tensors' own input size, channels and classes."""
    from dit_trainer.models.dit import DiT_models

    canonical = next((n for n in DiT_models if n.lower() == str(name).lower()), None)
    if canonical is None:
        raise CheckpointError(f"--model {name} is not a DiT size; pick one of {', '.join(DiT_models)}")
    keep = {k: shape[k] for k in ("input_size", "in_channels", "num_classes", "learn_sigma")}
    return {"name": canonical, **keep, "class_dropout_prob": 0.1}
