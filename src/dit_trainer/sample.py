"""`dit sample`: class-conditional images from a trained DiT, as a PNG grid or an ADM `.npz` batch.

Sampling follows facebookresearch/DiT's sample.py: EMA weights, classifier-free guidance on a
doubled batch (labels then null labels) through `model.forward_with_cfg`, latents decoded by the
VAE the model was trained with. Pixel models (the digits demo) need no decoder.
"""

import contextlib
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dit_trainer.class_names import dataset_class_names, resolve_labels
from dit_trainer.errors import CheckpointError, ConfigError, DitError

__all__ = [
    "add_commands", "decode", "default_classes", "load_decoder", "load_model", "run", "sample_grid_from_trainer",
    "sample_latents", "sample_npz", "save_grid", "save_npz", "to_images", "to_uint8", "vae_source",
]

DEFAULT_VAE = "stabilityai/sd-vae-ft-mse"
# The classes facebookresearch/DiT's sample.py draws by default.
IMAGENET_DEMO_LABELS = [207, 360, 387, 974, 88, 979, 417, 279]
_VAE_CACHE: dict = {}


# -- model and decoder ---------------------------------------------------------------------------


def load_model(ckpt, model_name=None, image_size=None, num_classes=1000, prefer_ema=True):
    """(eval-mode model, Config) from a checkpoint dir with config.yaml, a run dir, or an original DiT file."""
    from dit_trainer.config import Config, load_config
    from dit_trainer.models import get_spec
    from dit_trainer.train.checkpoint import latest_checkpoint, load_into, load_weights

    path = Path(ckpt)
    if not path.exists():
        raise CheckpointError(f"--ckpt {ckpt} does not exist; pass a checkpoint directory or a DiT .pt/.safetensors file")
    weights = ("ema.safetensors", "model.safetensors")
    if path.is_dir() and not any((path / name).is_file() for name in weights):
        latest = latest_checkpoint(path)  # a run's output_dir: take its newest checkpoint
        if latest is None:
            raise CheckpointError(f"{ckpt} has no config.yaml; pass a checkpoint directory like OUTPUT_DIR/checkpoints/step-00001000")
        path = latest
    if path.is_dir():
        cfg = load_config(str(path / "config.yaml"))
        if model_name and model_name != cfg.model.name:
            raise ConfigError(f"--model {model_name} conflicts with {path}/config.yaml ({cfg.model.name}); drop --model")
    else:
        if not model_name:
            raise ConfigError(f"--ckpt {ckpt} is a weights file: pass --model (e.g. DiT-XL/2) and --image-size too")
        size = int(image_size or 256)
        if size % 8:
            raise ConfigError(f"--image-size {size} is not a multiple of 8 (the VAE's downsampling factor)")
        cfg = Config()
        cfg.model.name, cfg.model.input_size, cfg.model.num_classes = model_name, size // 8, int(num_classes)
        cfg.data.image_size, cfg.data.vae = size, DEFAULT_VAE
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    load_into(model, load_weights(path, prefer_ema=prefer_ema), path)
    return model.eval(), cfg


def _manifest(path):
    if not path or path == "digits" or not os.path.isfile(os.path.join(path, "manifest.json")):
        return None
    try:
        from dit_trainer.data.shards import read_manifest

        return read_manifest(path)
    except (ImportError, DitError):
        return None


def vae_source(cfg, override=None):
    """(VAE id or folder, scaling_factor, shift_factor) that decodes the model's latents, or None for pixels."""
    data = cfg.data
    if data.path == "digits" and not override:
        return None
    manifest = _manifest(data.path) or {}
    vae = override or data.vae or manifest.get("vae")
    if not vae:
        return None
    # The latents were multiplied by the manifest's factor when extracted; the config's is the fallback.
    if manifest.get("scaling_factor") is not None:
        return str(vae), float(manifest["scaling_factor"]), manifest.get("shift_factor")
    return str(vae), float(data.scaling_factor), None


def load_decoder(cfg, vae=None, device="cpu", dtype="fp32"):
    """(AutoencoderKL or None, scaling_factor, shift_factor) for `cfg`; the last VAE stays cached."""
    source = vae_source(cfg, vae)
    if source is None:
        return None, None, None
    name, scaling_factor, shift_factor = source
    key = (name, str(device), str(dtype))
    if key not in _VAE_CACHE:
        from dit_trainer.data.vae import load_vae

        _VAE_CACHE.clear()  # one resident VAE is plenty; the trainer asks for the same one every time
        _VAE_CACHE[key] = load_vae(name, dtype, device)
    return _VAE_CACHE[key], scaling_factor, shift_factor


def decode(samples, vae=None, scaling_factor=None, shift_factor=None):
    """Images in [-1, 1], N×C×H×W float32: VAE-decoded latents, or the samples themselves for pixel models."""
    if vae is None:
        return samples.float().clamp(-1, 1)
    from dit_trainer.data.vae import decode as vae_decode

    return vae_decode(vae, samples, scaling_factor, shift_factor).float()


def _no_vae_error(channels: int) -> ConfigError:
    return ConfigError(f"the model makes {channels}-channel latents but no VAE is recorded (data.vae or the "
                       f"dataset's manifest.json); pass --vae ID_OR_DIR, e.g. {DEFAULT_VAE}")


def to_images(samples, vae=None, scaling_factor=None, shift_factor=None, strict=True):
    """`decode`, refusing (strict) or previewing the first three channels of latents no VAE is known for."""
    if vae is None and samples.shape[1] not in (1, 3):
        if strict:
            raise _no_vae_error(samples.shape[1])
        samples = samples[:, :3]  # a training-time preview is better than a crash mid-run
    return decode(samples, vae, scaling_factor, shift_factor)


# -- sampling ------------------------------------------------------------------------------------


def _diffusion_cfg(cfg, model):
    from dit_trainer.config import DiffusionConfig, as_config

    if cfg is None or isinstance(cfg, DiffusionConfig):
        diffusion = cfg or DiffusionConfig()
    else:
        diffusion = as_config(cfg).diffusion
    # The model's output channels decide whether a learned sigma is there to read.
    return SimpleNamespace(diffusion=diffusion, model=SimpleNamespace(learn_sigma=getattr(model, "learn_sigma", True)))


def build_sampler(cfg, sampler, steps):
    """The diffusion respaced for `steps` steps of "ddpm" (even spacing) or "ddim" (DDIM stride)."""
    from dit_trainer.train.trainer import build_diffusion

    if sampler not in ("ddpm", "ddim"):
        raise ConfigError(f"sampler {sampler!r} is not one of ddpm, ddim")
    total = cfg.diffusion.num_timesteps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= total:
        raise ConfigError(f"--steps {steps!r} must be an integer from 1 to {total}")
    try:
        return build_diffusion(cfg, timestep_respacing=f"ddim{steps}" if sampler == "ddim" else str(steps))
    except ValueError as err:
        raise ConfigError(f"--steps {steps} does not work with {sampler} ({err}); try 25, 50, 100 or 250") from None


def has_null_class(model) -> bool:
    """Whether the model learned the null label that classifier-free guidance needs."""
    table = getattr(getattr(model, "y_embedder", None), "embedding_table", None)
    return table is None or table.num_embeddings > model.num_classes


@contextlib.contextmanager
def _private_rng(seed: int, device: torch.device):
    # The diffusion loops draw their per-step noise from the global RNG. Forking it gives them a
    # seeded stream and hands the caller (the trainer's resumable RNG state) back untouched.
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


@torch.no_grad()
def sample_latents(model, diffusion_cfg_or_cfg, labels, cfg_scale=4.0, sampler="ddim", steps=50, seed=0,
                   device="cpu", cfg_channels=None, progress=False, clip_denoised=None):
    """Samples in the model's space (latents, or pixels) for `labels`: float N×C×H×W.

    `clip_denoised` defaults to clipping x_0 for pixel models (1 or 3 channels) only, as the
    release does not clip latents.
    """
    device = torch.device(device)
    diffusion = build_sampler(_diffusion_cfg(diffusion_cfg_or_cfg, model), sampler, steps)
    y = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if len(y) == 0:
        raise ConfigError("no class labels to sample; pass --class-labels or --class-names")
    if int(y.min()) < 0 or int(y.max()) >= model.num_classes:
        raise ConfigError(f"class labels must lie in 0..{model.num_classes - 1}, got {y.tolist()}")
    n, channels = len(y), model.in_channels
    size = getattr(model, "input_size", None) or model.x_embedder.img_size[0]
    generator = torch.Generator().manual_seed(int(seed))  # CPU: the same images on every device
    z = torch.randn((n, channels, size, size), generator=generator).to(device)
    step_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    y = y.to(device)
    guided = float(cfg_scale) != 1.0
    if guided:
        if not has_null_class(model):
            raise ConfigError("this model was trained without label dropout, so it has no null class; use --cfg-scale 1")
        z, y = torch.cat([z, z]), torch.cat([y, torch.full_like(y, model.num_classes)])
        kwargs = {"y": y, "cfg_scale": float(cfg_scale)}
        if cfg_channels is not None:
            kwargs["cfg_channels"] = int(cfg_channels)
        fn = model.forward_with_cfg
    else:
        kwargs, fn = {"y": y}, model
    if clip_denoised is None:
        clip_denoised = channels in (1, 3)
    loop = diffusion.ddim_sample_loop if sampler == "ddim" else diffusion.p_sample_loop
    was_training = model.training
    model.eval()  # in train mode the label embedder would drop labels at random
    try:
        with _private_rng(step_seed, device):
            out = loop(fn, tuple(z.shape), noise=z, clip_denoised=clip_denoised, model_kwargs=kwargs,
                       device=device, progress=progress)
    finally:
        model.train(was_training)
    return out[:n].float() if guided else out.float()


def default_classes(num_classes: int, count: int = 10) -> list:
    """Up to `count` class ids spread evenly over 0..num_classes-1."""
    k = max(1, min(count, num_classes))
    return sorted({round(i * (num_classes - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def sample_npz(model, cfg, path, num_samples, batch_size, labels=None, decoder=(None, None, None), seed=0, **kwargs):
    """ADM-style FID batch at `path`: arr_0 uint8 N×H×W×3, arr_1 int64 labels (uniform unless `labels`)."""
    if num_samples < 1 or batch_size < 1:
        raise ConfigError(f"--num-samples {num_samples} and --batch-size {batch_size} must be positive")
    generator = torch.Generator().manual_seed(int(seed))
    if labels:
        y_all = torch.tensor(list(labels), dtype=torch.long).repeat(math.ceil(num_samples / len(labels)))[:num_samples]
    else:
        y_all = torch.randint(0, model.num_classes, (num_samples,), generator=generator)
    from tqdm.auto import tqdm

    arr = None
    starts = range(0, num_samples, batch_size)
    for start in tqdm(starts, desc="sample", disable=not kwargs.pop("progress", False), dynamic_ncols=True):
        y = y_all[start:start + batch_size]
        batch_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        images = to_uint8(to_images(sample_latents(model, cfg, y, seed=batch_seed, **kwargs), *decoder))
        if images.shape[-1] == 1:
            images = np.repeat(images, 3, axis=-1)  # FID evaluators expect RGB
        if arr is None:
            arr = np.empty((num_samples, *images.shape[1:]), dtype=np.uint8)
        arr[start:start + len(y)] = images
    return save_npz(path, arr, y_all.numpy())


def sample_grid_from_trainer(trainer, path, classes=None, per_class=None, steps=None, cfg_scale=None):
    """The training-time grid from `trainer.ema`, one row per class, written to `path`.

    The same seed every time shows the model's progress on fixed noise; sampling uses its own
    generator and a forked global RNG, so the training run's randomness is untouched.
    """
    cfg, log = trainer.cfg, trainer.cfg.logging
    model = trainer.ema
    if classes is None:
        classes = log.sample_classes or default_classes(model.num_classes)
    classes = resolve_labels(classes, dataset_class_names(cfg, model.num_classes), model.num_classes)
    per_class = int(per_class or log.samples_per_class)
    scale = log.sample_cfg_scale if cfg_scale is None else cfg_scale
    if not has_null_class(model):
        scale = 1.0  # guidance needs the null class that label dropout trains
    samples = sample_latents(model, cfg, [c for c in classes for _ in range(per_class)], cfg_scale=scale,
                             sampler="ddim", steps=int(steps or log.sample_steps), seed=cfg.train.seed,
                             device=trainer.device)
    images = to_images(samples, *load_decoder(cfg, device=trainer.device), strict=False)
    return save_grid(images, path, nrow=per_class)


# -- images and files ----------------------------------------------------------------------------


def to_uint8(images) -> np.ndarray:
    """uint8 N×H×W×C from float N×C×H×W images in [-1, 1] (uint8 arrays pass through as N×H×W×C)."""
    if isinstance(images, np.ndarray) and images.dtype == np.uint8:
        return images if images.ndim == 4 else images[None]
    x = torch.as_tensor(images).detach().cpu()
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dtype != torch.uint8:
        x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous().numpy()


def save_grid(images, path, nrow=8, padding=2):
    """Write images as one PNG, `nrow` per row with black `padding` (torchvision's make_grid layout)."""
    from PIL import Image

    arr = to_uint8(images)
    n, h, w, c = arr.shape
    if c not in (1, 3):
        raise ConfigError(f"cannot save {c}-channel images; decode latents through their VAE first")
    cols = max(1, min(int(nrow), n))
    rows = math.ceil(n / cols)
    grid = np.zeros((rows * (h + padding) + padding, cols * (w + padding) + padding, c), dtype=np.uint8)
    for i, img in enumerate(arr):
        top, left = padding + (i // cols) * (h + padding), padding + (i % cols) * (w + padding)
        grid[top:top + h, left:left + w] = img
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Grayscale stays single-channel ("L"): the digits demo's classifier reads it back as such.
    Image.fromarray(grid[..., 0] if c == 1 else grid).save(path)
    return path


def save_npz(path, images: np.ndarray, labels: np.ndarray):
    """Write arr_0 (images) and arr_1 (labels) to `path` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:  # a file object keeps numpy from appending ".npz" to the name
        np.savez(f, arr_0=images, arr_1=labels.astype(np.int64))
    os.replace(tmp, path)
    return path


# -- command line --------------------------------------------------------------------------------


def add_commands(subparsers) -> None:
    """Register `dit sample`."""
    p = subparsers.add_parser(
        "sample",
        help="sample images from a checkpoint (PNG grid or .npz for FID)",
        description="Sample class-conditional images with classifier-free guidance from a checkpoint's EMA weights.",
    )
    p.add_argument("--ckpt", required=True, help="checkpoint dir (config.yaml + ema.safetensors), run dir, or DiT .pt/.safetensors")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--class-labels", type=int, nargs="+", metavar="ID", help="class ids, e.g. 207 360")
    which.add_argument("--class-names", nargs="+", metavar="NAME", help='class names, e.g. "golden retriever" otter')
    p.add_argument("--cfg-scale", type=float, default=4.0, help="guidance scale; 1 disables guidance (default 4)")
    p.add_argument("--cfg-channels", type=int, default=None, help="guide only the first N channels (the release's FIDs used 3)")
    p.add_argument("--sampler", choices=("ddpm", "ddim"), default="ddpm")
    p.add_argument("--steps", type=int, default=250, help="sampling steps (default 250)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="PNG grid to write (default samples.png unless --npz is given)")
    p.add_argument("--per-class", type=int, default=1, help="samples per label in the grid, one row per label")
    p.add_argument("--nrow", type=int, default=None, help="images per grid row")
    p.add_argument("--npz", default=None, help="write an ADM-style .npz batch (arr_0 uint8 N×H×W×3) for FID")
    p.add_argument("--num-samples", type=int, default=50000, help="samples in the .npz (default 50000)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per forward batch for --npz")
    p.add_argument("--model", default=None, help="model name for a weights file, e.g. DiT-XL/2")
    p.add_argument("--image-size", type=int, default=None, help="pixel size for a weights file (256 or 512)")
    p.add_argument("--num-classes", type=int, default=1000, help="classes of a weights file (default 1000)")
    p.add_argument("--vae", default=None, help=f"VAE id or folder, overriding the recorded one (weights files: {DEFAULT_VAE})")
    p.add_argument("--vae-dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--weights", choices=("ema", "model"), default="ema", help="which weights of a checkpoint dir")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    """Load the checkpoint, sample, and write the grid and/or the .npz."""
    from dit_trainer.train.trainer import resolve_device

    device = resolve_device(args.device)
    model, cfg = load_model(args.ckpt, args.model, args.image_size, args.num_classes, prefer_ema=args.weights == "ema")
    model.to(device)
    num_classes = model.num_classes
    labels = None
    if args.class_names:
        labels = resolve_labels(args.class_names, dataset_class_names(cfg, num_classes), num_classes)
    elif args.class_labels:
        labels = resolve_labels(args.class_labels, num_classes=num_classes)
    # Load the VAE before minutes of sampling, so a missing one fails at once.
    decoder = load_decoder(cfg, args.vae, device, args.vae_dtype)
    if decoder[0] is None and model.in_channels not in (1, 3):
        raise _no_vae_error(model.in_channels)
    common = dict(cfg_scale=args.cfg_scale, sampler=args.sampler, steps=args.steps, device=device,
                  cfg_channels=args.cfg_channels)
    if args.npz:
        path = sample_npz(model, cfg, args.npz, args.num_samples, args.batch_size, labels=labels, decoder=decoder,
                          seed=args.seed, progress=not args.no_progress, **common)
        print(f"wrote {args.num_samples} samples to {path}")
    if args.out or not args.npz:
        if labels is None:
            labels = IMAGENET_DEMO_LABELS if num_classes == 1000 else default_classes(num_classes)
        per_class = max(1, args.per_class)
        grid_labels = [c for c in labels for _ in range(per_class)]
        samples = sample_latents(model, cfg, grid_labels, seed=args.seed, progress=not args.no_progress, **common)
        nrow = args.nrow or (per_class if per_class > 1 else min(len(grid_labels), 8))
        path = save_grid(to_images(samples, *decoder), args.out or "samples.png", nrow=nrow)
        print(f"wrote {len(grid_labels)} samples to {path}")
    return 0
