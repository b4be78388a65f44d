"""`dit sample`: a PNG grid or an ADM `.npz` batch from a checkpoint."""

import dataclasses
import sys

from dit_trainer.config.checks import SAMPLERS
from dit_trainer.errors import ConfigError
from dit_trainer.host_memory import keep_freed_memory_on
from dit_trainer.sample.decode import DEFAULT_VAE

# Registering the command must not import torch (`dit --help` stays fast): `run` imports the rest.


def add_commands(subparsers) -> None:
    """Register `dit sample`."""
    p = subparsers.add_parser(
        "sample",
        help="sample images from a checkpoint (PNG grid or .npz for FID)",
        description="Sample class-conditional images (class labels) or text-conditional ones (prompts) with "
                    "classifier-free guidance from a checkpoint's EMA weights.",
    )
    p.add_argument("--ckpt", required=True, help="checkpoint dir (config.yaml + ema.safetensors), run dir, or DiT .pt/.safetensors")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--class-labels", type=int, nargs="+", metavar="ID", help="class ids, e.g. 207 360")
    which.add_argument("--class-names", nargs="+", metavar="NAME", help='class names, e.g. "golden retriever" otter')
    add_prompt_arguments(which, grid=True)
    p.add_argument("--out", default=None, help="PNG grid to write (default samples.png unless --npz is given)")
    p.add_argument("--per-class", "--per-prompt", dest="per_class", type=int, default=1,
                   help="samples per label or prompt in the grid, one row per label or prompt")
    p.add_argument("--nrow", type=int, default=None, help="images per grid row")
    p.add_argument("--npz", default=None, help="write an ADM-style .npz batch (arr_0 uint8 N×H×W×3) for FID, as "
                   "sample-ddp does on one process: classes covered uniformly, resumable")
    p.add_argument("--num-samples", type=int, default=50000, help="samples in the .npz")
    p.add_argument("--batch-size", type=int, default=32, help="samples per forward batch for --npz")
    add_sampling_arguments(p)
    p.set_defaults(func=run)


def add_prompt_arguments(group, grid: bool) -> None:
    """The prompts of a text-to-image checkpoint: `--prompt` (the grid's, `grid`) and `--prompts FILE`."""
    if grid:
        group.add_argument("--prompt", nargs="+", metavar="TEXT",
                           help='prompts of a text-to-image checkpoint, e.g. "a red cat" "two dogs" (one grid row each)')
    group.add_argument("--prompts", dest="prompts_file", metavar="FILE",
                       help="a text file of prompts, one per line: the grid's rows, or the prompts an FID batch "
                            "covers (cycled evenly in a seeded order, as class labels are); text-to-image checkpoints")


def add_sampling_arguments(p, cfg_scale: float = 4.0) -> None:
    """The flags `dit sample` and `dit sample-ddp` share: checkpoint reading, guidance, sampler.

    Unset, a flag takes the run's `sample:` section (what the run recommends), else its default
    (`settings.resolve` makes them one SampleSettings);
    `cfg_scale` is the release's default of each command (sample.py 4.0 for pictures, sample_ddp.py 1.5,
    the FID setting of the paper)."""
    p.set_defaults(release_cfg_scale=cfg_scale)
    p.add_argument("--cfg-scale", type=float, default=None,
                   help=f"classifier-free guidance weight, >= 1; 1 disables it (default: the run's sample.cfg_scale, "
                        f"else {cfg_scale})")
    p.add_argument("--cfg-channels", type=int, default=None, help="guide only the first N channels (the release's FIDs used 3)")
    p.add_argument("--guide", default=None, metavar="CKPT",
                   help="autoguidance: guide with this checkpoint instead of (or besides) the null label: a step "
                        "of the same run (300), a share of the main checkpoint's step (50%%), the run's post-hoc EMA "
                        "at such a share (phema/std0.100@50%%, rebuilt from its snapshots when missing), or a "
                        "checkpoint/run folder of the same latent shape, classes and objective (default: the run's "
                        "sample.guide)")
    p.add_argument("--guide-scale", type=float, default=None, metavar="W",
                   help="autoguidance weight: D_guide + W (D - D_guide); 1 turns it off (default: the run's "
                        "sample.guide_scale)")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("SIGMA_LO", "SIGMA_HI"),
                   help="guide only where the noise level sigma (noise over signal scale, EDM's sigma, the same for "
                        "every schedule and objective) lies in (SIGMA_LO, SIGMA_HI]; inf for no upper bound "
                        "(default: the run's sample.guidance_interval, else every step)")
    p.add_argument("--ema-std", default=None, metavar="SIGMA_REL",
                   help="sample the post-hoc EMA of this sigma_rel at the checkpoint's step (rebuilt from the run's "
                        "snapshots as `dit ema` does, when missing); none: the checkpoint's ema.safetensors (default: "
                        "the run's sample.ema_std)")
    p.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="ddpm or ddim for diffusion (default ddpm), ode or sde for transport (default ode), meanflow "
                        "for MeanFlow; default: the run's sample.sampler")
    p.add_argument("--steps", "--num-sampling-steps", type=int, default=None,
                   help="sampling steps (default: the run's sample.steps, else ddpm 250, ddim 50, ode 50 for "
                        "fixed-step methods, sde 250)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial noise")
    p.add_argument("--model", default=None, help="model of a weights file: a name such as DiT-XL/2, or a PaddleMIX DiT "
                   "JSON / our YAML model config (then its sample_size and classes are used)")
    p.add_argument("--image-size", type=int, default=None, help="pixel size for a weights file (256 or 512)")
    p.add_argument("--num-classes", type=int, default=1000, help="classes of a weights file")
    p.add_argument("--negative-prompt", default=None, metavar="TEXT",
                   help='text-to-image: the caption guidance steers away from, encoded in place of the empty caption '
                        '(default: the run\'s sample.negative_prompt, else "", as diffusers\' PixArt pipelines)')
    p.add_argument("--text-encoder", default=None, metavar="DIR_OR_ID",
                   help="text-to-image: the text encoder folder or Hugging Face id that encodes the prompts, "
                        "overriding the one the run records (data.text_encoder)")
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


def sampler_options(settings, objective, sampler) -> dict:
    """The sampler-specific flags given (`settings.options`), as `objective.sample` options; those `sampler` does
    not take are refused."""
    own = objective.sampler_option_names(sampler)
    given = settings.options
    foreign = sorted(k for k in given if k not in own)
    if foreign:
        flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise ConfigError(f"{flags} do(es) not apply to --sampler {sampler}")
    if given.get("sde_last_step") == "None":
        given["sde_last_step"] = None
    return given


def note_adaptive_steps(settings, sampler, cfg) -> None:
    """A one-line note when --steps meets an adaptive ODE method, whose step count it does not set."""
    if sampler != "ode" or settings.steps is None:
        return
    from dit_trainer.transport.integrators import is_adaptive

    method = settings.options.get("ode_method") or cfg.transport.ode_method
    if is_adaptive(method):
        print(f"note: --steps {settings.steps} sets output times only: {method} chooses its own steps (--atol/--rtol); "
              f"pass --ode-method euler, midpoint, rk4 or heun3 for a fixed step count", file=sys.stderr)


def check_args(args) -> None:
    """One-line errors for flag values no sampling can use and outputs that cannot be written (before the model
    loads)."""
    from dit_trainer.sample.settings import check_flags, given_of

    check_flags(given_of(args))
    for flag in ("--per-class", "--nrow"):
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


def check_cfg_channels(settings, model) -> None:
    """--cfg-channels beyond the model's channels is a one-line error."""
    if settings.cfg_channels is not None and settings.cfg_channels > model.in_channels:
        raise ConfigError(f"--cfg-channels {settings.cfg_channels} exceeds the model's {model.in_channels} channels; "
                          f"pass 1..{model.in_channels} or leave it out (all channels)")


def load_sampling_model(settings, ckpt):
    """(model, cfg) of checkpoint `ckpt` (a path or a `checkpoint.open` reader) with `settings.weights` (and, for a
    weights file, `settings.model`, `image_size`, `num_classes`)."""
    from dit_trainer.sample.loading import load_model

    return load_model(ckpt, settings.model, settings.image_size, settings.num_classes, weights=settings.weights)


@dataclasses.dataclass
class SamplingRun:
    """A checkpoint's model on its device and what sampling it takes: objective, sampler, its options, the
    guidance (a guide model for autoguidance, the noise-level interval), the VAE, the readers sampled from,
    and for a text-to-image model its condition and frozen text encoder."""

    model: object
    cfg: object
    objective: object
    sampler: str
    options: dict
    device: object
    settings: object  # the SampleSettings it was prepared from
    decoder: tuple = (None, None, None)
    reader: object = None  # the checkpoint the model's weights came from (a post-hoc EMA folder with ema_std)
    guide: object = None  # autoguidance's guide model, or None
    guide_reader: object = None
    condition: object = None  # a text model's TextCondition (None: class labels)
    encoder: object = None  # a text model's frozen TextEncoder

    @property
    def prompts(self):
        """The settings' prompts for a text-to-image model (a tuple), None for a class-conditional one."""
        return self.settings.prompts if self.encoder is not None else None

    def guidance(self) -> dict:
        """`sample_latents`' guidance keywords."""
        s = self.settings
        return {"cfg_scale": s.cfg_scale, "cfg_channels": s.cfg_channels, "guide": self.guide,
                "guide_scale": s.guide_scale if self.guide is not None else 1.0,
                "guidance_interval": s.guidance_interval}

    def sample(self, rows, seed, compiled=False, progress=False, counter=None):
        """Latents for `rows`: class labels, or a text model's prompts (encoded, guided with the settings'
        negative prompt), sampled with the settings' sampler and guidance from `seed`."""
        from dit_trainer.sample.prompts import sample_prompts
        from dit_trainer.sample.sampling import sample_latents

        kw = dict(sampler=self.sampler, steps=self.settings.steps, seed=seed, device=self.device, progress=progress,
                  compile=compiled, counter=counter, **self.guidance(), **self.options)
        if self.encoder is None:
            return sample_latents(self.model, self.objective, rows, **kw)
        return sample_prompts(self.model, self.objective, self.condition, self.encoder, rows,
                              negative_prompt=self.settings.negative_prompt, image_size=self.cfg.data.image_size, **kw)


_TEXT_FLAGS = (("prompts", "--prompt/--prompts"), ("negative_prompt", "--negative-prompt"),
               ("text_encoder", "--text-encoder"))


def check_condition(settings, model, cfg) -> bool:
    """Whether `model` is text-conditioned; a one-line ConfigError when the settings condition it otherwise
    (prompts for a class-conditional model, none for a text one)."""
    text = "text_embeds" in tuple(getattr(model, "condition_keys", ("y",)))
    if text and not settings.prompts:
        raise ConfigError(f"{cfg.model.name} is text-conditioned; pass --prompt TEXT (a grid) or --prompts FILE (one "
                          "prompt per line) instead of class labels")
    given = [flag for key, flag in _TEXT_FLAGS if getattr(settings, key) is not None]
    if not text and given:
        raise ConfigError(f"{cfg.model.name} is class-conditional; {given[0]} is for text-to-image checkpoints: pass "
                          "--class-labels or --class-names instead")
    return text


def prepare_sampling(settings, reader, device, located=None, rank=0) -> SamplingRun:
    """The SamplingRun of `settings` on main checkpoint `reader` (a path or a `checkpoint.open` reader), its other
    checkpoints where `located` (`run_settings.locate`) says; without `located` they are located (and missing
    post-hoc EMA folders rebuilt) here, for one process. The VAE is loaded apart (`load_vae`)."""
    from dit_trainer import checkpoint
    from dit_trainer.sample.run_settings import load_guide, locate, rebuild_missing
    from dit_trainer.sample.sampling import as_objective

    reader = checkpoint.open(reader, flag="--ckpt")
    if located is None:
        located = locate(settings, reader)
        rebuild_missing([located])
    main = reader if located.main == reader.path else checkpoint.open(located.main)
    model, cfg = load_sampling_model(settings, main)
    check_cfg_channels(settings, model)
    text = check_condition(settings, model, cfg)
    model.to(device)
    objective = as_objective(cfg, model)
    # The release's sampler (DDPM for diffusion) unless one is named.
    sampler = objective.check_sampler(settings.sampler or objective.samplers[0])
    options = sampler_options(settings, objective, sampler)
    if rank == 0:
        note_adaptive_steps(settings, sampler, cfg)
    guide = guide_reader = condition = encoder = None
    if located.guide is not None:
        guide, guide_reader = load_guide(located.guide, cfg, model, device, f"{settings.guide_origin} {settings.guide}")
    if text:  # the prompts' encoder: the run's, as its captions were encoded
        from dit_trainer.sample.prompts import run_text_encoder, text_condition

        condition = text_condition(model, cfg)
        encoder = run_text_encoder(cfg, settings.text_encoder, device, main.folder)
    return SamplingRun(model, cfg, objective, sampler, options, device, settings, reader=main, guide=guide,
                       guide_reader=guide_reader, condition=condition, encoder=encoder)


def load_vae(run: SamplingRun) -> None:
    """Load the VAE into `run` before minutes of sampling, so a missing one fails at once."""
    from dit_trainer.sample.decode import _no_vae_error, load_decoder

    run.decoder = load_decoder(run.cfg, run.settings.vae, run.device, run.settings.vae_dtype)
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
    from dit_trainer.sample.sampling import IMAGENET_DEMO_LABELS, default_classes
    from dit_trainer.sample.settings import from_flags

    check_args(args)
    grid_path = args.out or (None if args.npz else "samples.png")
    if grid_path and not args.overwrite:  # before minutes of sampling: a picture there is the user's
        refuse_existing(grid_path, "--out", ConfigError)
    device = resolve_device(args.device, "--device")
    keep_freed_memory_on(device)
    reader = checkpoint.open(args.ckpt, flag="--ckpt")
    settings = from_flags(args, getattr(reader.config(), "sample", None))
    sampling = prepare_sampling(settings, reader, device)
    model, cfg = sampling.model, sampling.cfg
    num_classes = model.num_classes
    labels = None
    if sampling.prompts is not None and (args.class_names or args.class_labels):
        flag = "--class-names" if args.class_names else "--class-labels"
        raise ConfigError(f"{cfg.model.name} is text-conditioned; {flag} is for class-conditional checkpoints: pass "
                          "--prompt TEXT or --prompts FILE instead")
    if args.class_names:
        labels = resolve_labels(args.class_names, dataset_class_names(cfg, num_classes), num_classes)
    elif args.class_labels:
        labels = resolve_labels(args.class_labels, num_classes=num_classes)
    load_vae(sampling)
    grid = grid_path is not None
    batches = (len(rank_chunks(settings.num_samples, settings.batch_size)) if settings.npz else 0) + int(grid)
    compiled = resolve_sample_compile(settings.compile, model, batches, settings.steps, device)
    if settings.npz:
        write_fid_batch(settings, sampling.reader, sampling, compiled, classes=labels)
    if grid:
        rows = sampling.prompts
        if rows is None:
            rows = labels if labels is not None else (
                IMAGENET_DEMO_LABELS if num_classes == 1000 else default_classes(num_classes))
        per_class = args.per_class
        grid_rows = [c for c in rows for _ in range(per_class)]
        samples = sampling.sample(grid_rows, settings.seed, compiled, progress=settings.progress)
        nrow = args.nrow or (per_class if per_class > 1 else min(len(grid_rows), 8))
        path = save_grid(to_images(samples, *sampling.decoder), grid_path, nrow=nrow)
        print(f"wrote {len(grid_rows)} samples to {path}")
    return 0
