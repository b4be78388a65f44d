"""What benchmarks/time_to_quality.py trains and how it samples: the tasks, the recipes as config
overrides of the demo's config, and the sampler settings that give every recipe the same number of
network evaluations per sample (NFE)."""

from dataclasses import dataclass, field

SIT = {"objective": "transport"}
# LightningDiT's block only (not its VA-VAE latents, schedule or other training choices).
LIGHTNING_BLOCK = {"model.norm": "rmsnorm", "model.mlp": "swiglu", "model.rope": True, "model.qk_norm": True}

# The pieces a recipe is made of; "routing" is the task's own span (its depth decides it).
PARTS = {
    "sit": SIT,
    # A logit-normal density on DiT's step axis, step floor(T * sigmoid(N(0, 1))): SD3's shape, but
    # on the steps of a cosine schedule, which is neither SD3's nor FasterDiT's density on a
    # rectified flow's t.
    "logit-normal-steps": {"diffusion.timestep_sampler": "logit-normal"},
    # FasterDiT's lognorm(0, 1) on a rectified flow's t, carried over to DiT's steps by noise level.
    "lognormal-snr": {"diffusion.timestep_sampler": "lognormal"},
    "min-snr": {"diffusion.loss_weighting": "min-snr"},
    # SD3's logit-normal density on the transport's rectified-flow t (at mean 0 the mirrored t, data at
    # 1 here and noise in SD3, changes nothing).
    "logit-normal-t": {"transport.t_sampler": "logit-normal"},
    # The direction term, one cosine over each whole sample. LightningDiT's per-position form is
    # not a recipe: on the digits' one channel it is a sign with no gradient (transport/direction.py).
    "direction-flattened": {"transport.direction_loss_weight": 1.0, "transport.direction_loss_form": "flattened"},
    "lightning-block": LIGHTNING_BLOCK,
    # Not an acceleration: the demo keeps no EMA (its samples are recognised best without one), and the
    # raw weights' FID swings from checkpoint to checkpoint; an EMA of about the last 100 steps shows
    # what that choice costs.
    "ema": {"train.ema_decay": 0.99},
    "routing": None,
}

RECIPES = {
    "dit": (),
    "sit": ("sit",),
    "dit+logit-normal-steps": ("logit-normal-steps",),
    "dit+lognormal-snr": ("lognormal-snr",),
    "dit+min-snr": ("min-snr",),
    "dit+routing": ("routing",),
    "dit+lightning-block": ("lightning-block",),
    "sit+logit-normal-t": ("sit", "logit-normal-t"),
    "sit+direction-flattened": ("sit", "direction-flattened"),
    "sit+routing": ("sit", "routing"),
    "dit+all": ("logit-normal-steps", "min-snr", "routing", "lightning-block"),
    "sit+all": ("sit", "logit-normal-t", "direction-flattened", "routing", "lightning-block"),
    "sit+ema": ("sit", "ema"),
}
BASELINE = "dit"
# Labels of earlier versions of this script (benchmarks/RESULTS.md names them), and what they are now.
RENAMED = {"dit+logit-normal": "dit+logit-normal-steps", "sit+logit-normal": "sit+logit-normal-t",
           "dit+lightning": "dit+lightning-block", "sit+direction": "sit+direction-flattened"}


@dataclass(frozen=True)
class Task:
    """The demo's config with another model and image size, and the defaults of a measurement on it."""

    name: str
    about: str
    model: dict  # keys over the demo's model section
    digits_size: int
    routing: dict  # train.routing_* of the +routing recipes: TREAD's span for this depth
    steps: int  # the DiT recipe's steps: the budget and the equal-steps point
    save_every: int
    probe_steps: int
    probe_log_steps: int  # the probe's windows: its first (warm-up) is left out, the median of the rest kept
    recipes: tuple = field(default=tuple(RECIPES))


TASKS = {
    # The demo: DiT-S/4-shaped, 4 blocks of width 192, 16x16 digits in pixel space: 16 tokens.
    "digits16": Task("digits16", "the demo: 16x16 digits, patch 4 (16 tokens), 4 blocks of width 192",
                     model={}, digits_size=16,
                     # Of the 4 blocks, route the middle two (TREAD keeps the first and last blocks full).
                     routing={"train.routing_keep": 0.5, "train.routing_start": 1, "train.routing_end": 3},
                     steps=1400, save_every=100, probe_steps=60, probe_log_steps=10),
    # Shaped like DiT-XL/2 on ImageNet-256 latents (32x32, patch 2: 256 tokens), the token count users
    # train routing at (one channel, as the digits have). 8 blocks: twice the demo's depth, what two
    # cores afford (3.7 s a step of batch 64 on quiet cores against the demo's 0.12, 2,000 steps about
    # 2 hours); the width stays the demo's 192: the step's cost grows with its square.
    "latent256": Task("latent256", "32x32 digits, patch 2 (256 tokens, as DiT-XL/2 sees ImageNet-256), 8 blocks "
                                   "of width 192",
                      model={"name": "DiT-S/2", "input_size": 32, "depth": 8}, digits_size=32,
                      # TREAD's span: every block but the first two and the last two.
                      routing={"train.routing_keep": 0.5, "train.routing_start": 2, "train.routing_end": -2},
                      steps=2000, save_every=250, probe_steps=20, probe_log_steps=5,
                      recipes=("dit", "sit", "dit+routing", "sit+routing")),
}


def recipe_overrides(recipe: str, task: Task) -> dict:
    """The config keys `recipe` changes in `task`'s config (dotted key -> value)."""
    out = {}
    for part in RECIPES[recipe]:
        out.update(task.routing if part == "routing" else PARTS[part])
    return out


def objective_of(recipe: str) -> str:
    """transport for the SiT recipes, diffusion for the DiT ones."""
    return "transport" if "sit" in RECIPES[recipe] else "diffusion"


def task_config(task: Task, seed: int, steps: int, save_every: int, log_steps: int) -> dict:
    """The demo's config as DiT (a recipe's overrides make it SiT) reshaped for `task`, for `steps` steps
    and `seed`, saving every `save_every` steps; without output_dir (the caller's folder)."""
    from dit_trainer.demo import demo_config

    raw = demo_config("", steps=steps, seed=seed, objective="diffusion", fid_samples=0)
    del raw["output_dir"]
    # Sampling is set by the script's flags alone: what a run recommends in its `sample:` section
    # (autoguidance, a guidance interval, another EMA) would change what the tables compare.
    raw.pop("sample", None)
    # Nor does the demo's post-hoc EMA take part: the recipes are scored on their checkpoints' weights, and
    # its snapshots would cost every run the same time and disk for nothing the tables read.
    raw["train"].update(phema_stds=[], phema_every=0)
    raw["model"].update(task.model)
    raw["data"]["digits_size"] = task.digits_size
    raw["checkpoint"].update(save_steps=save_every, save_total_limit=0)
    raw["logging"].update(log_steps=log_steps, progress=False)
    return raw


# Network evaluations per step of torchdiffeq's fixed-grid methods.
ODE_STAGES = {"euler": 1, "midpoint": 2, "heun3": 3, "rk4": 4}


def sampler_flags(objective: str, nfe: int, ode_method: str) -> list:
    """`dit sample-ddp` flags that sample `objective` with `nfe` network evaluations per sample.

    DDIM evaluates once per step: `nfe` steps. The ODE takes `--steps` grid points, so steps - 1
    intervals of `ODE_STAGES[ode_method]` evaluations each. A ValueError when `nfe` does not divide.
    """
    if objective == "diffusion":
        return ["--sampler", "ddim", "--steps", nfe]
    stages = ODE_STAGES.get(ode_method)
    if stages is None:
        raise ValueError(f"--ode-method {ode_method!r} is not a fixed-step method of {', '.join(ODE_STAGES)}")
    if nfe < stages or nfe % stages:
        raise ValueError(f"--nfe {nfe} is not a positive multiple of {ode_method}'s {stages} evaluations per step")
    return ["--sampler", "ode", "--ode-method", ode_method, "--steps", nfe // stages + 1]


def sampler_label(flags: list) -> str:
    """`flags` in a few characters: "ddim 50", "midpoint 25" (steps between grid points)."""
    options = dict(zip(flags[::2], flags[1::2]))
    if options["--sampler"] == "ddim":
        return f"ddim {options['--steps']}"
    return f"{options['--ode-method']} {options['--steps'] - 1}"


def recorded_nfe(nfe: int, cfg_scale: float) -> int:
    """What `dit sample-ddp` records per sample for `nfe` evaluations per branch: it counts the conditional
    and the null-label pass each, so guidance (a scale other than 1) records twice `nfe`."""
    return nfe * (1 if cfg_scale == 1 else 2)
