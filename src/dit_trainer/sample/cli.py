"""`dit sample`: a PNG grid or an ADM `.npz` batch from a checkpoint."""

import dataclasses
import math
import sys

from dit_trainer.errors import ConfigError
from dit_trainer.host_memory import keep_freed_memory_on
from dit_trainer.sample.decode import DEFAULT_VAE

# Registering the command must not import torch (`dit --help` stays fast): `run` imports the rest.


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
    p.add_argument("--out", default=None, help="PNG grid to write (default samples.png unless --npz is given)")
    p.add_argument("--per-class", type=int, default=1, help="samples per label in the grid, one row per label")
    p.add_argument("--nrow", type=int, default=None, help="images per grid row")
    p.add_argument("--npz", default=None, help="write an ADM-style .npz batch (arr_0 uint8 N×H×W×3) for FID, as "
                   "sample-ddp does on one process: classes covered uniformly, resumable")
    p.add_argument("--num-samples", type=int, default=50000, help="samples in the .npz")
    p.add_argument("--batch-size", type=int, default=32, help="samples per forward batch for --npz")
    add_sampling_arguments(p)
    p.set_defaults(func=run)


def add_sampling_arguments(p, cfg_scale: float = 4.0) -> None:
    """The flags `dit sample`, `dit sample-ddp` and `dit eval --ckpt` share: checkpoint reading, guidance, sampler.

    Unset, a flag takes the run's `sample:` section (what the run recommends), else its default;
    `cfg_scale` is the release's default of each command (sample.py 4.0 for pictures, sample_ddp.py 1.5,
    the FID setting of the paper)."""
    p.set_defaults(release_cfg_scale=cfg_scale)
    p.add_argument("--cfg-scale", type=float, default=None,
                   help=f"classifier-free guidance weight, >= 1; 1 disables it (default: the run's sample.cfg_scale, "
                        f"else {cfg_scale})")
    p.add_argument("--cfg-channels", type=int, default=None, help="guide only the first N channels (the release's FIDs used 3)")
    p.add_argument("--guide", default=None, metavar="CKPT",
                   help="autoguidance: guide with this checkpoint instead of (or besides) the null label: a step "
                        "number of the same run (e.g. 300) or a checkpoint/run folder of the same latent shape, "
                        "classes and objective (default: the run's sample.guide)")
    p.add_argument("--guide-scale", type=float, default=None, metavar="W",
                   help="autoguidance weight: D_guide + W (D - D_guide); 1 turns it off (default: the run's "
                        "sample.guide_scale)")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("SIGMA_LO", "SIGMA_HI"),
                   help="guide only where the noise level sigma (noise over signal scale, EDM's sigma, the same for "
                        "every schedule and objective) lies in (SIGMA_LO, SIGMA_HI]; inf for no upper bound "
                        "(default: the run's sample.guidance_interval, else every step)")
    p.add_argument("--ema-std", default=None, metavar="SIGMA_REL",
                   help="sample the post-hoc EMA of this sigma_rel (reconstructed by `dit ema`); none: the "
                        "checkpoint's ema.safetensors (default: the run's sample.ema_std)")
    p.add_argument("--sampler", choices=("ddpm", "ddim", "ode", "sde"), default=None,
                   help="ddpm or ddim for diffusion (default ddpm), ode or sde for transport (default ode); "
                        "default: the run's sample.sampler")
    p.add_argument("--steps", "--num-sampling-steps", type=int, default=None,
                   help="sampling steps (default: the run's sample.steps, else ddpm 250, ddim 50, ode 50 for "
                        "fixed-step methods, sde 250)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial noise")
    p.add_argument("--model", default=None, help="model of a weights file: a name such as DiT-XL/2, or a PaddleMIX DiT "
                   "JSON / our YAML model config (then its sample_size and classes are used)")
    p.add_argument("--image-size", type=int, default=None, help="pixel size for a weights file (256 or 512)")
    p.add_argument("--num-classes", type=int, default=1000, help="classes of a weights file")
    p.add_argument("--vae", default=None, help=f"VAE id or folder, overriding the recorded one (weights files: {DEFAULT_VAE})")
    p.add_argument("--vae-dtype", choices=("fp32", "bf16"), default="fp32", help="VAE compute dtype")
    p.add_argument("--weights", choices=("ema", "model"), default="ema", help="which weights of a checkpoint dir")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out picture, or an --npz (and its preview .png) that is not this command's "
                        "batch of the same settings; without it such a file is refused, and a finished batch of the same "
                        "settings is done")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--compile", choices=("auto", "true", "false"), default="auto",
                   help="torch.compile the model's forward first (about a minute once); auto: when the run makes "
                        "1000+ model calls of a 10M+ parameter model, e.g. an FID batch")
    t = p.add_argument_group("transport sampling (SiT; defaults from the run's transport: section)")
    t.add_argument("--ode-method", default=None, help="torchdiffeq method: euler, midpoint, rk4, dopri5, heun3, ...")
    t.add_argument("--atol", type=float, default=None, help="ODE absolute tolerance (adaptive methods)")
    t.add_argument("--rtol", type=float, default=None, help="ODE relative tolerance (adaptive methods)")
    t.add_argument("--sde-method", choices=("Euler", "Heun"), default=None, help="SDE integrator")
    t.add_argument("--sde-diffusion-form", default=None, help="SDE diffusion coefficient",
                   choices=("sigma", "constant", "SBDM", "linear", "decreasing", "increasing-decreasing"))
    t.add_argument("--sde-diffusion-norm", type=float, default=None, help="scale of the SDE diffusion coefficient")
    t.add_argument("--sde-last-step", default=None, choices=("Mean", "Tweedie", "Euler", "None"), help="SDE last step")
    t.add_argument("--sde-last-step-size", type=float, default=None, help="size of the SDE last step")


# The flags of the sampler-specific argument group, by dest: the objective says which its sampler takes.
SAMPLER_FLAGS = ("ode_method", "atol", "rtol", "sde_method", "sde_diffusion_form", "sde_diffusion_norm", "sde_last_step",
                 "sde_last_step_size")


def sampler_options(args, objective, sampler) -> dict:
    """The sampler-specific flags the user gave, as `objective.sample` options; those `sampler` does not take are refused."""
    own = objective.sampler_option_names(sampler)
    given = {k: getattr(args, k) for k in SAMPLER_FLAGS if getattr(args, k, None) is not None}
    foreign = sorted(k for k in given if k not in own)
    if foreign:
        flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise ConfigError(f"{flags} do(es) not apply to --sampler {sampler}")
    if given.get("sde_last_step") == "None":
        given["sde_last_step"] = None
    return given


def note_adaptive_steps(args, sampler, cfg) -> None:
    """A one-line note when --steps meets an adaptive ODE method, whose step count it does not set."""
    if sampler != "ode" or args.steps is None:
        return
    from dit_trainer.transport.integrators import is_adaptive

    method = args.ode_method or cfg.transport.ode_method
    if is_adaptive(method):
        print(f"note: --steps {args.steps} sets output times only: {method} chooses its own steps (--atol/--rtol); "
              f"pass --ode-method euler, midpoint, rk4 or heun3 for a fixed step count", file=sys.stderr)


def check_args(args) -> None:
    """One-line errors for values no sampling can use (checked before the model loads)."""
    if args.cfg_scale is not None and (not args.cfg_scale >= 1 or not math.isfinite(args.cfg_scale)):
        raise ConfigError(f"--cfg-scale is {args.cfg_scale}; it must be a number >= 1 (1 disables guidance)")
    if args.guide_scale is not None and not (args.guide_scale >= 1 and math.isfinite(args.guide_scale)):
        raise ConfigError(f"--guide-scale is {args.guide_scale}; it must be a number >= 1 (1: no autoguidance)")
    if args.guidance_interval is not None:
        from dit_trainer.config.checks import guidance_interval

        guidance_interval(args.guidance_interval, "--guidance-interval")
    for flag in ("--per-class", "--steps", "--num-samples", "--batch-size", "--cfg-channels", "--nrow", "--image-size",
                 "--num-classes"):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and value < 1:
            raise ConfigError(f"{flag} is {value}; it must be 1 or more")
    # Before minutes of sampling: a path PIL or np.savez cannot write would lose them all.
    from dit_trainer.fs import check_output_path

    if getattr(args, "out", None) is not None:
        check_output_path(args.out, "--out", ConfigError, suffixes=image_suffixes())
    if getattr(args, "npz", None) is not None:
        check_output_path(args.npz, "--npz", ConfigError, suffixes=(".npz",))


def image_suffixes() -> tuple:
    """The file endings PIL can write an image as (.png first)."""
    from PIL import Image

    Image.init()
    found = sorted(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.SAVE)
    common = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tiff")
    return (*common, *[e for e in found if e not in common])


def check_cfg_channels(args, model) -> None:
    """--cfg-channels beyond the model's channels is a one-line error."""
    if args.cfg_channels is not None and args.cfg_channels > model.in_channels:
        raise ConfigError(f"--cfg-channels {args.cfg_channels} exceeds the model's {model.in_channels} channels; "
                          f"pass 1..{model.in_channels} or leave it out (all channels)")


def fid_settings(args):
    """The `fid_batch.FidBatchSettings` of the --npz flags (`dit sample` samples in fp32)."""
    from dit_trainer.sample.fid_batch import FidBatchSettings

    return FidBatchSettings(
        npz=args.npz, ckpt=args.ckpt, num_samples=args.num_samples, batch_size=args.batch_size, seed=args.seed,
        steps=args.steps, cfg_scale=args.cfg_scale, cfg_channels=args.cfg_channels, dtype=getattr(args, "dtype", "fp32"),
        guide_scale=args.guide_scale,
        guidance_interval=None if args.guidance_interval is None else tuple(float(v) for v in args.guidance_interval),
        weights=args.weights, vae=args.vae, vae_dtype=args.vae_dtype, progress=not args.no_progress,
        overwrite=args.overwrite)


def load_sampling_model(args, ckpt):
    """(model, cfg) of checkpoint `ckpt` (a path or a `checkpoint.open` reader) with `--weights`."""
    from dit_trainer.sample.loading import load_model

    return load_model(ckpt, args.model, args.image_size, args.num_classes, weights=args.weights)


@dataclasses.dataclass
class SamplingRun:
    """A checkpoint's model on its device and what sampling it takes: objective, sampler, its options, the
    guidance (a guide model for autoguidance, the noise-level interval), the VAE, and the readers sampled from."""

    model: object
    cfg: object
    objective: object
    sampler: str
    options: dict
    device: object
    decoder: tuple = (None, None, None)
    reader: object = None  # the checkpoint the model's weights came from (a post-hoc EMA folder with --ema-std)
    guide: object = None  # autoguidance's guide model, or None
    guide_reader: object = None
    args: object = None  # the command's flags with the unset ones resolved (the run's sample: section, the defaults)

    def guidance(self) -> dict:
        """`sample_latents`' guidance keywords."""
        a = self.args
        interval = None if a.guidance_interval is None else tuple(a.guidance_interval)
        return {"cfg_scale": a.cfg_scale, "cfg_channels": a.cfg_channels, "guide": self.guide,
                "guide_scale": a.guide_scale if self.guide is not None else 1.0, "guidance_interval": interval}


def prepare_sampling(args, ckpt, device, rank=0) -> SamplingRun:
    """The SamplingRun of `ckpt` (a path or a `checkpoint.open` reader) with every sampling flag checked and
    the unset ones taken from the run's `sample:` section; the VAE is loaded apart (`load_vae`), so a command
    can check its own flags first."""
    import copy

    from dit_trainer import checkpoint
    from dit_trainer.sample.run_settings import apply_recommended, ema_reader, load_guide, run_folder
    from dit_trainer.sample.sampling import as_objective

    reader = checkpoint.open(ckpt, flag="--ckpt")
    given_guide = args.guide is not None
    args = copy.copy(args)  # the caller's flags stay as typed: a second call resolves them alike
    apply_recommended(args, reader.config(), args.release_cfg_scale)
    reader = ema_reader(reader, args.ema_std)
    model, cfg = load_sampling_model(args, reader)
    check_cfg_channels(args, model)
    model.to(device)
    objective = as_objective(cfg, model)
    # The release's sampler (DDPM for diffusion) unless one is named.
    sampler = objective.check_sampler(args.sampler or objective.samplers[0])
    options = sampler_options(args, objective, sampler)
    if rank == 0:
        note_adaptive_steps(args, sampler, cfg)
    guide = guide_reader = None
    if args.guide is not None:
        guide, guide_reader = load_guide(args.guide, run_folder(reader), cfg, model, device, from_config=not given_guide)
    return SamplingRun(model, cfg, objective, sampler, options, device, reader=reader, guide=guide,
                       guide_reader=guide_reader, args=args)


def load_vae(args, run: SamplingRun) -> None:
    """Load the VAE into `run` before minutes of sampling, so a missing one fails at once."""
    from dit_trainer.sample.decode import _no_vae_error, load_decoder

    run.decoder = load_decoder(run.cfg, args.vae, run.device, args.vae_dtype)
    if run.decoder[0] is None and run.model.in_channels not in (1, 3):
        raise _no_vae_error(run.model.in_channels)


def run(args) -> int:
    """Load the checkpoint, sample, and write the grid and/or the .npz (`dit sample-ddp`'s writer, on one process)."""
    from dit_trainer import checkpoint
    from dit_trainer.class_names import dataset_class_names, resolve_labels
    from dit_trainer.devices import resolve_device
    from dit_trainer.fs import refuse_existing
    from dit_trainer.sample.compile import resolve_sample_compile
    from dit_trainer.sample.decode import to_images
    from dit_trainer.sample.fid_batch import rank_chunks, write_fid_batch
    from dit_trainer.sample.images import save_grid
    from dit_trainer.sample.sampling import IMAGENET_DEMO_LABELS, default_classes, sample_latents

    check_args(args)
    grid_path = args.out or (None if args.npz else "samples.png")
    if grid_path and not args.overwrite:  # before minutes of sampling: a picture there is the user's
        refuse_existing(grid_path, "--out", ConfigError)
    device = resolve_device(args.device, "--device")
    keep_freed_memory_on(device)
    reader = checkpoint.open(args.ckpt, flag="--ckpt")
    sampling = prepare_sampling(args, reader, device)
    model, cfg = sampling.model, sampling.cfg
    num_classes = model.num_classes
    labels = None
    if args.class_names:
        labels = resolve_labels(args.class_names, dataset_class_names(cfg, num_classes), num_classes)
    elif args.class_labels:
        labels = resolve_labels(args.class_labels, num_classes=num_classes)
    load_vae(args, sampling)
    grid = grid_path is not None
    batches = (len(rank_chunks(args.num_samples, args.batch_size)) if args.npz else 0) + int(grid)
    compiled = resolve_sample_compile(args.compile, model, batches, sampling.args.steps, device)
    if args.npz:
        write_fid_batch(fid_settings(sampling.args), sampling.reader, sampling, compiled, classes=labels)
    if grid:
        if labels is None:
            labels = IMAGENET_DEMO_LABELS if num_classes == 1000 else default_classes(num_classes)
        per_class = args.per_class
        grid_labels = [c for c in labels for _ in range(per_class)]
        samples = sample_latents(model, sampling.objective, grid_labels, sampler=sampling.sampler, steps=sampling.args.steps,
                                 seed=args.seed, device=device, progress=not args.no_progress, compile=compiled,
                                 **sampling.guidance(), **sampling.options)
        nrow = args.nrow or (per_class if per_class > 1 else min(len(grid_labels), 8))
        path = save_grid(to_images(samples, *sampling.decoder), grid_path, nrow=nrow)
        print(f"wrote {len(grid_labels)} samples to {path}")
    return 0
