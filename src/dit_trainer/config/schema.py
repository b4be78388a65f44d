"""The config's sections: one dataclass each, every key a typed field with its meaning as a comment.

Field names follow what PaddleMIX/DiT users already type (`model.name`, `data.path`,
`train.max_steps`, `train.global_batch_size`, `optim.lr`, `checkpoint.save_steps`, ...). The
comment after each field is its documentation (`dit train --help`, docs/config.md).
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from dit_trainer.meanflow.config import MeanFlowConfig
from dit_trainer.repa.config import RepaConfig
from dit_trainer.transport.config import TransportConfig


@dataclass
class ModelConfig:
    """What every model family shares. The family's own fields (`depth`, `hidden_size`, `dim`, ...)
    live in `options` (`cfg.model.options["depth"]`), are written at this section's level in YAML,
    and are typed and checked against the family's config dataclass (`ModelSpec.config_cls`)."""

    name: str = "DiT-S/2"  # registered model name, e.g. DiT-XL/2 (any case)
    input_size: int = 32  # latent (or pixel) side; taken from the weights, else the data, when not set
    in_channels: int = 4  # latent (or pixel) channels; taken from the weights, else the data, when not set
    num_classes: int = 1000  # class labels 0..num_classes-1; taken from the weights, else the data, when not set
    learn_sigma: bool = True  # also predict the variance (the DiT release does)
    class_dropout_prob: float = 0.1  # share of labels dropped for classifier-free guidance, in [0, 1)
    weights_path: Optional[str] = None  # start from weights (our run or checkpoint dir, a DiT/SiT/Large-DiT release file, .safetensors); they give the model's shape, and another num_classes starts only the label embedding anew
    config_file: Optional[str] = None  # model from a PaddleMIX DiT JSON or our model YAML/JSON; keys set beside it win
    options: dict = field(default_factory=dict)


@dataclass
class DiffusionConfig:
    num_timesteps: int = 1000  # diffusion steps of training
    noise_schedule: str = "linear"  # linear | cosine | sigmoid
    predict_xstart: bool = False  # predict the clean input instead of the noise
    use_kl: bool = False  # train on the variational bound instead of the noise MSE
    sigma_small: bool = False  # fixed small variance when the model does not learn it
    rescale_learned_sigmas: bool = False  # rescale the variance term of the loss (improved DDPM)
    timestep_sampler: str = "uniform"  # uniform | loss-second-moment | logit-normal | lognormal. logit-normal: SD3's density on the step axis, step floor(num_timesteps * sigmoid(timestep_mean + timestep_std * N(0, 1))). lognormal: FasterDiT's lognorm(m, s), which is that density on a rectified flow's t; carried over by noise level, the step whose SNR is nearest ((1 - u) / u)^2 at u = sigmoid(m + s * N(0, 1)), a log-normal SNR. Both: timestep_mean > 0 favours the noisier steps, and the loss is not reweighted back to uniform
    timestep_mean: float = 0.0  # mean m of the logit-normal and lognormal timestep samplers
    timestep_std: float = 1.0  # std s (> 0) of the logit-normal and lognormal timestep samplers
    loss_weighting: str = "none"  # none | min-snr: weigh the MSE term by min(SNR, min_snr_gamma) / SNR (noise prediction) or min(SNR, min_snr_gamma) (predict_xstart); a learned variance's bound term is left as it is
    min_snr_gamma: float = 5.0  # the gamma (> 0) of min-snr loss weighting


@dataclass
class DataConfig:
    path: Optional[str] = None  # latents (shards from dit extract, .npy folder, fast-DiT features), an image folder (encoded as read, into a latent cache) or "digits" (with data.text_encoder: the digits captioned by what they show, the text demo's data)
    labels_file: Optional[str] = None  # labels.json|.npy|.txt of a .npy folder (default: the one beside it)
    unconditional: bool = False  # a .npy folder without labels: train one class
    class_names: Optional[list] = None  # names of the classes, index = label; taken from the data when not set
    random_flip: bool = True  # flip latents horizontally at random
    num_workers: int = 2  # data loading processes
    image_size: int = 256  # image folder: the crop size in pixels (dit extract --image-size); latents: the size they came from (shards record it)
    digits_size: int = 16  # side of the digits when path is "digits": 8 as stored, 16 or 32 upsampled
    vae: Optional[str] = None  # VAE id or folder (dit extract --vae): encodes an image folder (None: stabilityai/sd-vae-ft-mse) and decodes samples (shards record theirs)
    vae_dtype: str = "auto"  # auto | fp32 | bf16: the VAE's compute dtype for an image folder; auto: bf16 on a GPU, fp32 (dit extract's default) on a CPU
    cache_dir: Optional[str] = None  # where the latent caches of image folders go (None: ~/.cache/dit-trainer/latents); shared by all nodes
    scaling_factor: float = 0.18215  # factor the latents were multiplied by (shards record theirs)
    latent_norm: str = "auto"  # auto | channel | scale: how the model sees the latents. channel: (z - latent_mean) / latent_std per channel, undone before the VAE decodes; scale: as stored (the VAE's scaling_factor alone, the SD VAEs' way); auto: what `dit extract` recorded (channel for any VAE but the 4-channel KL ones); latents it did not measure are used as stored, except those of a named VAE with other than 4 channels, which are refused. See docs/data.md
    latent_mean: Optional[list] = None  # per-channel mean of the stored latents (dit extract records it in manifest.json and the run's config.yaml keeps it); set by hand only for latents extract did not measure
    latent_std: Optional[list] = None  # per-channel std of the stored latents, each > 0; set with latent_mean
    allow_changed: bool = False  # resume although the image folder changed since the checkpoint (a warning instead of a refusal; the resume is then not exact)
    text_encoder: Optional[str] = None  # text-to-image: the frozen text encoder (a transformers folder or hub id: T5, CLIP with projection, Gemma 2) whose outputs condition the model; None: class labels. Shards record theirs
    text_max_length: int = 0  # tokens per caption (longer ones are truncated, with a count in the log); 0: the model family's default (PixArt-alpha 120, PixArt-Sigma 300)
    text_dtype: str = "auto"  # auto | fp32 | bf16: the text encoder's compute dtype; auto: bf16 on a GPU, fp32 on a CPU
    caption_dropout_prob: float = 0.1  # share of captions replaced by the encoding of "" during training (diffusers' convention), for classifier-free guidance; in [0, 1)
    empty_captions: str = "error"  # error | drop: an image whose caption is missing or empty stops with a one-line error naming it, or is left out (counted in the log)
    val_split: Optional[int] = None  # samples of data.path held out of training for validation (the loss at fixed noise levels, the grid's captions, FID over prompts), the same fixed choice for every run of the data; None: 64 (at most 1% of the data) for a text-conditioned model, 0 for class labels; 0 with data.val_path
    val_path: Optional[str] = None  # held-out data of its own for validation, in any layout data.path takes (the same latent shape and text encoder); replaces data.val_split


@dataclass
class OptimConfig:
    lr: float = 1e-4  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    beta1: float = 0.9  # AdamW beta1, in [0, 1)
    beta2: float = 0.999  # AdamW beta2, in [0, 1)
    eps: float = 1e-8  # AdamW epsilon
    warmup_steps: int = 0  # linear learning-rate warmup steps
    lr_schedule: str = "constant"  # constant | cosine | linear: after warmup, lr throughout, or decaying to min_lr at train.max_steps
    decay_steps: int = 0  # cosine or linear: decay over the run's last decay_steps (warmup-stable-decay); 0: over everything after warmup
    min_lr: float = 0.0  # where cosine or linear decay ends, below optim.lr
    max_grad_norm: float = 0.0  # clip the gradient norm to this; 0 disables clipping


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps to train for
    global_batch_size: int = 256  # samples per optimizer step over all processes
    grad_accum_steps: int = 1  # split each process's batch into this many micro-batches
    seed: int = 0  # seed of the data order, noise and initial weights
    mixed_precision: str = "bf16"  # bf16 | fp16 | fp32; bf16 falls back to fp32 where unsupported
    ema_decay: float = 0.9999  # EMA weight decay per step, in [0, 1]; lower it for short runs
    ema_warmup: bool = False  # decay min(ema_decay, (1+step)/(10+step)): short runs get a useful EMA
    phema_stds: list = field(default_factory=list)  # post-hoc EMA (EDM2's power-function EMA): the widths sigma_rel tracked beside the EMA, each in (0, 0.2887), e.g. [0.05, 0.10]; each costs one more copy of the weights. Snapshots go to output_dir/phema, and `dit ema` rebuilds the EMA of any width from them. [] is off
    phema_every: int = 0  # steps between post-hoc EMA snapshots (the last step writes one too); 0: at every checkpoint.save_steps
    phema_dtype: str = "fp16"  # fp16 | fp32: what post-hoc EMA snapshots store the profiles in (EDM2 stores fp16; frozen parameters keep their own dtype)
    activation_checkpointing: str = "none"  # none | full | selective
    compile: str = "auto"  # auto | true | false: torch.compile each block; auto: for runs that repay the ~1 min compile
    compile_cache: str = "auto"  # where compiled blocks are kept for the next start of this model on this machine and torch (one subfolder per model, torch and device): auto is output_dir/compile_cache; a path (e.g. a node-local disk) to share it between runs; off leaves torch's default (/tmp/torchinductor_USER)
    activation_memory_budget: float = 0.8  # compiled blocks without AC keep this fraction of the activations inductor would keep, recomputing the cheapest rest; 1 keeps all
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    skip_nonfinite_steps: bool = False  # a NaN/inf loss or grad norm skips the update instead of stopping
    routing_keep: float = 1.0  # token routing (TREAD): share of each image's tokens that go through blocks [routing_start, routing_end) during training, a fresh random subset each step; the rest skip them and rejoin after; 1 is off; inference always uses every token
    routing_start: int = 2  # first block of the routed span (TREAD's: the first two blocks see every token)
    routing_end: int = -2  # end of the routed span, exclusive; negative counts from the last block (-2: the last two blocks see every token)


@dataclass
class CheckpointConfig:
    save_steps: int = 1000  # save a checkpoint every this many steps (and at the end)
    save_total_limit: int = 3  # keep the newest this many checkpoints that verify; 0 keeps all
    keep_steps: list = field(default_factory=list)  # also save at these steps and keep their checkpoints whatever save_total_limit says (e.g. an early one as autoguidance's guide, sample.guide)
    resume: bool = True  # resume from the newest usable checkpoint in output_dir
    resume_from: Optional[str] = None  # resume from this checkpoint folder or step number instead of the newest; newer ones move to checkpoints/abandoned-*
    sharded: bool = False  # torch.distributed.checkpoint instead of full safetensors
    on_existing: str = "refuse"  # resume false over an earlier run: refuse | archive (move aside) | overwrite
    allow_new_seed: bool = False  # resume a checkpoint of another train.seed: the data order follows the new seed from the saved sample on


@dataclass
class LoggingConfig:
    log_steps: int = 10  # log the loss every this many steps
    image_steps: int = 0  # draw a sample grid every this many steps; 0 disables
    tensorboard: bool = True  # also write TensorBoard events (scalars and sample grids)
    progress: bool = True  # show a progress bar on a terminal (written to a file, the log lines alone: no bar)
    sample_steps: int = 50  # DDIM steps for the training-time grid
    sample_cfg_scale: float = 4.0  # guidance scale of the training-time grid, >= 1
    samples_per_class: int = 1  # grid samples per class
    sample_classes: Optional[list] = None  # grid classes; None: up to 10 spread over the label range
    validation_prompts: Optional[str] = None  # text-conditioned models: a text file of the grid's prompts, one per line (as dit sample --prompts), encoded once by data.text_encoder; None: the first 8 held-out captions
    mfu: bool = False  # log model FLOPs utilisation (measures the peak at start unless peak_tflops is set)
    peak_tflops: float = 0.0  # peak TFLOP/s of one device for MFU (e.g. 989 for an H100 in bf16); 0 measures it
    wandb: bool = False  # also log to Weights & Biases (pip install wandb; WANDB_MODE=offline works offline)
    wandb_project: str = "dit-trainer"  # Weights & Biases project name


@dataclass
class EvalConfig:
    every: int = 0  # FID of the EMA model against the training set's statistics every this many steps; 0 disables
    num_samples: int = 1000  # samples per measurement, labels balanced over the classes, split over the ranks
    sample_batch_size: int = 50  # samples drawn per chunk (one seed each: the same noise at every measurement)
    sample_steps: int = 50  # sampler steps of those samples (the objective's default sampler)
    cfg_scale: float = 1.0  # their guidance scale, >= 1 (1: none, the usual training-time FID)
    guide: Optional[str] = None  # autoguidance for these samples: a step of this run (300) or a share of train.max_steps (50%), which joins checkpoint.keep_steps (with a note) unless the run keeps it anyway, used once it is saved (measurements before it are skipped, one after it that finds it gone is an error); or a checkpoint or run folder (relative to output_dir)
    guide_scale: Optional[float] = None  # autoguidance weight w > 1 (D_guide + w (D - D_guide)); needed with eval.guide
    guidance_interval: Optional[list] = None  # [sigma_lo, sigma_hi]: guide only where sigma_lo < sigma <= sigma_hi, as sample.guidance_interval
    network: str = "auto"  # auto | inception | digits; auto: the digit network for data.path digits, else Inception
    ref: Optional[str] = None  # reference .npz (ADM's, or dit eval --ref-from-*) instead of the training set's statistics
    ref_images: int = 10000  # training latents decoded for the statistics, this many at random; 0: all (image folders: all)
    inception_weights: Optional[str] = None  # Inception weight file; None: fetched into torch's hub cache on first use
    val_every: Optional[int] = None  # the loss at 8 fixed noise levels on the held-out data (data.val_split, data.val_path) every this many steps, logged as val_loss and val_loss_t0..t7; None: at every checkpoint.save_steps where data is held out; 0 disables
    clip_model: Optional[str] = None  # text-conditioned models: a local folder of a transformers CLIPModel (with its tokenizer and image processor); FID over the held-out captions then also logs their CLIP score


@dataclass
class SampleConfig:
    """How this run's samples are best drawn: what `dit sample` and `dit sample-ddp` use where no flag says
    otherwise (`dit demo` records what it found best here); sample/settings.py resolves them into one value."""

    cfg_scale: Optional[float] = None  # classifier-free guidance weight >= 1 (1: none); None: each command's release default (sample 4.0, sample-ddp 1.5)
    guide: Optional[str] = None  # autoguidance (Karras et al., 2024): the guide checkpoint, relative to the main checkpoint sampled: a step of its run (300: checkpoints/step-00000300, kept by checkpoint.keep_steps), a share of its step (50%: the checkpoint of half its step, rounded down), the run's post-hoc EMA at such a share (phema/std0.100@50%: sigma_rel 0.100 at the snapshot nearest half its step, the earlier of two as near, rebuilt from the snapshots when missing), or a path (relative to output_dir) to a checkpoint or run of the same latent shape, classes and objective; None: no autoguidance
    guide_scale: Optional[float] = None  # autoguidance weight w > 1: D_guide + w (D - D_guide); needed with sample.guide
    guidance_interval: Optional[list] = None  # [sigma_lo, sigma_hi]: guide only where sigma_lo < sigma <= sigma_hi, sigma the noise level (noise scale over signal scale, EDM's sigma: the same unit for every schedule and objective; .inf for no upper bound); None guides every step
    ema_std: Optional[float] = None  # sample the post-hoc EMA of this sigma_rel at the checkpoint's step, rebuilt from the train.phema_stds snapshots (as dit ema does) when missing; None: the checkpoint's ema.safetensors
    sampler: Optional[str] = None  # ddpm | ddim (diffusion), ode | sde (transport) or meanflow; None: the objective's own (ddpm, ode, meanflow)
    steps: Optional[int] = None  # sampler steps; None: the sampler's default
    negative_prompt: Optional[str] = None  # text-to-image: the caption guidance steers away from, in place of the empty caption; None: "" (the null caption, as diffusers' PixArt pipelines)


@dataclass
class ParallelConfig:
    layout: str = "manual"  # manual | auto: auto takes dit plan's fastest layout that fits the launched world size (degrees, schedule, micro-batches, AC, compile) and writes it into the run's config.yaml
    dp_replicate: int = 1  # data-parallel replicas (DDP, or HSDP's replicate groups)
    dp_shard: int = -1  # FSDP shard degree; -1: whatever the other degrees leave of the world size
    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree
    pp_schedule: str = "gpipe"  # gpipe | 1f1b | interleaved1f1b
    pp_microbatches: int = 4  # micro-batches per pipeline step
    reshard_after_forward: bool = True  # FSDP frees gathered weights after forward (less memory, more traffic)
    backend: str = "auto"  # auto | nccl | gloo; auto: nccl on GPU, gloo on CPU
    timeout: float = 600.0  # seconds a rank waits for a missing peer (a collective, or a heartbeat that stopped) before the run ends with one line naming it; 600 is NCCL's own default, long enough for a first compiled step or a checkpoint save


@dataclass
class Config:
    output_dir: str = "outputs/run"  # where checkpoints, metrics and samples go
    objective: str = "auto"  # auto | diffusion | transport | meanflow: what the model learns and how it samples; auto: what the model's releases used (transport for SiT, else diffusion); meanflow: one- and few-step generation (the meanflow: section)
    backend: str = "torch"  # torch | mindspore (the `mindspore` extra; DiT with the diffusion objective)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    meanflow: MeanFlowConfig = field(default_factory=MeanFlowConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    repa: RepaConfig = field(default_factory=RepaConfig)

    def to_dict(self) -> dict:
        """A plain nested dict (what `config.yaml` holds); family options sit in the model section."""
        d = dataclasses.asdict(self)
        d["model"].update(d["model"].pop("options"))
        return d


# The RFC's flat dict: {"model_name": "DiT-S/2", "weights_path": None, "lr": 1e-4, ...}
RFC_KEYS = {
    "model_name": "model.name",
    "weights_path": "model.weights_path",
    "lr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "num_timesteps": "diffusion.num_timesteps",
    "num_classes": "model.num_classes",
    "input_size": "model.input_size",
    "in_channels": "model.in_channels",
    "learn_sigma": "model.learn_sigma",
    "batch_size": "train.global_batch_size",
    "seed": "train.seed",
    "max_steps": "train.max_steps",
    "ema_decay": "train.ema_decay",
    "mixed_precision": "train.mixed_precision",
    "data_path": "data.path",
    "output_dir": "output_dir",
}


MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig))
SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.type))

# Keys older versions wrote into a run's config.yaml that nothing reads now: what replaced each.
RETIRED_KEYS = {
    "train.keep_freed_memory": "a CPU run keeps freed memory for reuse by itself",
    "train.host_sync": "the trainer reads a step's checks when the device has them: every step on a CPU, "
                       "at log steps on an accelerator",
}


# Keys that moved: a value there now would mean something else, so it is refused (null, as older
# run folders wrote it, is read and ignored).
MOVED_KEYS = {
    "diffusion.guidance_interval": "sample.guidance_interval",
    "transport.guidance_interval": "sample.guidance_interval",
}


def all_keys(cls=Config, prefix="") -> list:
    """Every dotted key of `cls` (sections recursed into), `model.options` included."""
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            keys += all_keys(f.type, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys
