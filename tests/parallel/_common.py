"""Shared by the distributed tests and the torchrun worker: a tiny DiT run and its data."""

import contextlib
import json
from pathlib import Path

import torch

from dit_trainer.config import build_config
from tests.repa._tiny import TINY_REPA

STEPS = 10


class TinyLatents(torch.utils.data.Dataset):
    """64 fixed random 4x8x8 latents with labels in [0, 10)."""

    def __init__(self, n=64):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 4, 8, 8, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class TinyCaptions(torch.utils.data.Dataset):
    """64 fixed random 4x8x8 latents with captions of 1 to 5 tokens (a text encoder's 16-wide outputs, stored
    in float16 as extract may store them), and the null caption's encoding: the batch the text contract names."""

    tokens, width = 5, 16

    def __init__(self, n=64, images=False):
        g = torch.Generator().manual_seed(4321)
        self.x = torch.randn(n, 4, 8, 8, generator=g)
        self.text_embeds = torch.randn(n, self.tokens, self.width, generator=g).half()
        lengths = torch.randint(1, self.tokens + 1, (n,), generator=g)
        self.text_mask = (torch.arange(self.tokens)[None] < lengths[:, None]).long()
        self._null = {"text_embeds": torch.randn(self.tokens, self.width, generator=g).half(),
                      "text_mask": torch.tensor([1] + [0] * (self.tokens - 1))}
        # `images`: each latent's clean uint8 image beside it, as a cache of `dit extract --keep-images` gives REPA
        self.return_images = images
        self.image = torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8) if images else None

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        item = {"x": self.x[i], "text_embeds": self.text_embeds[i], "text_mask": self.text_mask[i]}
        return {**item, "image": self.image[i]} if self.return_images else item

    def null_text(self) -> dict:
        """The encoding of "" (no batch dim)."""
        return dict(self._null)


# The tiny member of each family the layouts train: (objective, model section).
TINY_MODELS = {
    "dit": ("diffusion", {"name": "DiT-S/2", "depth": 4, "hidden_size": 64, "num_heads": 4}),
    "sit": ("transport", {"name": "SiT-S/2", "depth": 4, "hidden_size": 64, "num_heads": 4}),
    # Grouped kv heads and q/k norms: the parts of Large-DiT's plan that DiT's does not have.
    "ldit": ("diffusion", {"name": "LargeDiT-600M/2", "dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
                           "qk_norm": True}),
    # DiT with every block option on: RMSNorm, SwiGLU, 2-D RoPE and per-head q/k norms.
    "blockopts": ("diffusion", {"name": "DiT-S/2", "depth": 4, "hidden_size": 64, "num_heads": 4, "norm": "rmsnorm",
                                "mlp": "swiglu", "rope": True, "qk_norm": True}),
    # Text-conditioned: cross-attention to TinyCaptions' padded captions, half of them dropped to the null caption.
    "pixart": ("diffusion", {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 48, "num_heads": 4,
                             "text_hidden_size": TinyCaptions.width}),
    # MeanFlow: SiT with the interval input, the JVP in every step, guidance folded into the target.
    "mf": ("meanflow", {"name": "SiT-S/2", "depth": 2, "hidden_size": 64, "num_heads": 4}),
}


def dataset_for(kind: str, images: bool = False):
    """The tiny data a layout's family trains on: captions for PixArt (with `images`, their images too, for
    REPA), labels for the rest."""
    return TinyCaptions(images=images) if kind == "pixart" else TinyLatents()


def tiny_config(out, parallel=None, kind="dit", **sections):
    """Depth 4, hidden 64, 4 heads, 8x8x4 latents, 10 classes; global batch 8; checkpoints at 5 and 10."""
    d = {
        "output_dir": str(out),
        "objective": TINY_MODELS[kind][0],
        # SiT runs: the logit-normal t of SD3, so a layout that drew t differently would show.
        "transport": {"t_sampler": "logit-normal"},
        "model": {"input_size": 8, "in_channels": 4, "num_classes": 10, **TINY_MODELS[kind][1]},
        "data": {"num_workers": 0},
        # A clip norm that never clips makes every step log its gradient norm: AdamW is blind to a
        # constant gradient scale, so the norm is what shows a sum where a mean belongs (pytorch#162338).
        "optim": {"lr": 1e-3, "max_grad_norm": 1e6},
        "train": {"max_steps": STEPS, "global_batch_size": 8, "mixed_precision": "fp32", "device": "cpu",
                  "ema_decay": 0.9, "seed": 0},
        "checkpoint": {"save_steps": 5, "save_total_limit": 0},
        "logging": {"log_steps": 1, "tensorboard": False, "progress": False},
        "parallel": dict(parallel or {}),
    }
    if kind == "pixart":
        d["data"]["caption_dropout_prob"] = 0.5  # many dropped rows, so a layout that dropped others would show
    for name, values in sections.items():
        if isinstance(values, dict):
            d.setdefault(name, {}).update(values)
        else:  # a top-level key (objective)
            d[name] = values
    return build_config(d)


class DroppedRows:
    """Per step, the global-batch rows whose caption reached the model as the null caption's encoding."""

    def __init__(self, trainer):
        self.steps = []
        null = trainer.condition.null["text_embeds"]
        local = trainer.cfg.train.global_batch_size // trainer.dims.dp_size
        first = trainer.dims.dp_rank * local

        def hook(module, args, kwargs):
            if not module.training:
                return  # a validation's forward, not a step's
            embeds = kwargs["text_embeds"]
            self.steps.append([first + i for i in range(len(embeds)) if torch.equal(embeds[i], null)])

        trainer.model.register_forward_pre_hook(hook, with_kwargs=True)

    def write(self, path) -> None:
        Path(path).write_text(json.dumps(self.steps))


def read_dropped(run) -> list:
    """Per step, the rows every rank of a run saw dropped (dropped-*.json), merged."""
    steps = None
    for path in sorted(Path(run).glob("dropped-*.json")):
        rows = json.loads(path.read_text())
        steps = [sorted(set(a) | set(b)) for a, b in zip(steps, rows)] if steps is not None else rows
    return steps


def train_run(cfg, kind: str, rank: int = 0) -> None:
    """Train `cfg` on the family's tiny data; a text family's run records its dropped rows (dropped-RANK.json)."""
    from dit_trainer.train import DiTTrainer

    trainer = DiTTrainer(cfg, dataset=dataset_for(kind, images=cfg.repa.enabled))
    dropped = DroppedRows(trainer) if kind == "pixart" else None
    trainer.train()
    if dropped is not None:
        dropped.write(Path(cfg.output_dir) / f"dropped-{rank}.json")


def train_one_process(run, **kwargs):
    """Train tiny_config(run, **kwargs) on its family's tiny data in this process."""
    train_run(tiny_config(run, **kwargs), kwargs.get("kind", "dit"))


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms(True) inside, as the torchrun workers run; restored after."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def learns(trainer, prefixes, steps: int):
    """(the last of `steps` train steps' metrics, whether every tensor whose name starts with one of `prefixes`
    changed; False where there is none)."""
    before = {k: v.clone() for k, v in trainer.model.state_dict().items() if k.startswith(tuple(prefixes))}
    loader = trainer.build_loader()
    out = [trainer.train_step(next(loader)) for _ in range(steps)][-1]
    after = trainer.model.state_dict()
    return out, bool(before) and all(not torch.equal(before[k], after[k]) for k in before)


def read_losses(out, key="loss") -> dict:
    """step -> loss (or another metric) from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r[key] for r in rows if key in r}


# name -> parallel config; 2-rank and 4-rank layouts.
LAYOUTS_2 = {
    "ddp": {"dp_replicate": 2, "dp_shard": 1},
    "fsdp": {"dp_shard": 2},
    "tp": {"tp": 2, "dp_shard": 1},
    "pp_gpipe": {"pp": 2, "dp_shard": 1, "pp_schedule": "gpipe", "pp_microbatches": 4},
    "pp_1f1b": {"pp": 2, "dp_shard": 1, "pp_schedule": "1f1b", "pp_microbatches": 4},
}
LAYOUTS_4 = {
    "fsdp_tp": {"dp_shard": 2, "tp": 2},
    "hsdp": {"dp_replicate": 2, "dp_shard": 2},
    "pp_fsdp": {"pp": 2, "dp_shard": 2, "pp_microbatches": 2},
    "pp_interleaved_tp": {"pp": 2, "tp": 2, "dp_shard": 1, "pp_schedule": "interleaved1f1b", "pp_microbatches": 4},
    # Replicas beside TP/PP run as HSDP with shards of one (DDP does not compose with them).
    "tp_replicate": {"tp": 2, "dp_replicate": 2, "dp_shard": 1},
    "pp_replicate": {"pp": 2, "dp_replicate": 2, "dp_shard": 1, "pp_microbatches": 2},
}
# SiT (the transport objective) and Large-DiT under the sharded layouts, each against its own
# 1-process run ("sit_reference", "ldit_reference").
LAYOUTS_2.update({f"{kind}_{name}": LAYOUTS_2[src] for kind in ("sit", "ldit")
                  for name, src in (("fsdp", "fsdp"), ("tp", "tp"), ("pp", "pp_1f1b"))})
LAYOUTS_4["ldit_fsdp_tp"] = LAYOUTS_4["fsdp_tp"]
# PixArt (text-conditioned, cross-attention; not pipelined) under FSDP and TP against "pixart_reference".
LAYOUTS_2.update({"pixart_fsdp": LAYOUTS_2["fsdp"], "pixart_tp": LAYOUTS_2["tp"]})
# The block options' layers under TP (their plan) and FSDP, in a launch of their own (test_block_options_layouts).
BLOCK_OPTION_LAYOUTS = {"blockopts_tp": LAYOUTS_2["tp"], "blockopts_fsdp": LAYOUTS_2["fsdp"]}


# MeanFlow's guidance scale drawn per sample and given to the network (meanflow.omega_range).
SCALE_RANGE = {"omega_range": [1.0, 2.0], "omega": 1.5, "kappa": 0.0}
# The objectives' training options, each under FSDP and TP ("opt-<name>_fsdp", "opt-<name>_tp")
# against its own 1-process run ("opt-<name>_reference"): (tiny model, config sections).
OPTIONS = {
    "logitnormal": ("dit", {"diffusion": {"timestep_sampler": "logit-normal", "timestep_mean": 0.5}}),
    "lognormal": ("dit", {"diffusion": {"timestep_sampler": "lognormal", "timestep_std": 1.5}}),
    "minsnr": ("dit", {"diffusion": {"loss_weighting": "min-snr", "min_snr_gamma": 2.0}}),
    "direction": ("sit", {"transport": {"t_sampler": "logit-normal", "direction_loss_weight": 0.5}}),
    # MeanFlow's three du/dt paths (TP only for the difference: DTensor has no forward-mode AD). norm_p 0.5:
    # the default adaptive weight logs every loss as about 1, which would hide a layout's difference. The
    # separate path guides with the official omega and kappa; the other two draw each sample's scale
    # (omega_range), which the network takes as an input.
    "mfseparate": ("mf", {"meanflow": {"ratio": 0.5, "norm_p": 0.5}}),
    "mfgraph": ("mf", {"meanflow": {"ratio": 0.5, "norm_p": 0.5, "jvp": "graph", **SCALE_RANGE}}),
    "mfdifference": ("mf", {"meanflow": {"ratio": 0.5, "norm_p": 0.5, "jvp": "difference", **SCALE_RANGE}}),
    # The text-conditioned family as MeanFlow: the guided target's unconditional velocity is the null caption's.
    "mfpixart": ("pixart", {"objective": "meanflow",
                            "meanflow": {"ratio": 0.5, "norm_p": 0.5, "jvp": "difference", "omega": 1.5}}),
    # REPA on captions: the projector reads PixArt's first block, the encoder its captioned images.
    "repapixart": ("pixart", {"repa": dict(TINY_REPA)}),
}
# Where each option trains beside its 1-process run: DDP's second step is what the JVP path must survive;
# the difference path, having no forward-mode AD, under TP (its DDP step is the separate path's).
OPTION_LAYOUTS = {"mfseparate": ("ddp", "fsdp"), "mfgraph": ("fsdp",), "mfdifference": ("tp",),
                  "mfpixart": ("fsdp", "tp"), "repapixart": ("fsdp", "tp")}
LAYOUTS_OPTIONS = {f"opt-{opt}_{name}": LAYOUTS_2[name] for opt in OPTIONS
                   for name in OPTION_LAYOUTS.get(opt, ("fsdp", "tp"))}


# PixArt's runs hold 8 captions out and validate at their checkpoints: every layout's validation loss is
# one process's (fixed levels and noise, each rank a share of the held-out samples).
PIXART_SECTIONS = {"data": {"val_split": 8}}


def option_sections(layout: str) -> dict:
    """The config sections a layout's run adds: an "opt-<name>_..." run's options, PixArt's held-out captions."""
    head = layout.split("_")[0]
    if head.startswith("opt-"):
        return OPTIONS[head[4:]][1]
    return PIXART_SECTIONS if head == "pixart" else {}


# Token routing (half the tokens skip the middle two blocks) under the sharded layouts, against
# a routed 1-process run; Large-DiT's routed tokens keep their rotary positions through TP and AC.
ROUTING = {"routing_keep": 0.5, "routing_start": 1, "routing_end": -1}
LAYOUTS_2.update({"routed_fsdp": LAYOUTS_2["fsdp"], "routed_tp": LAYOUTS_2["tp"], "ldit_routed_tp": LAYOUTS_2["tp"]})


def kind_of(layout: str) -> str:
    """Which tiny model a layout's run trains: "dit", "sit" or "ldit"."""
    head = layout.split("_")[0]
    if head.startswith("opt-"):
        return OPTIONS[head[4:]][0]
    return head if head in TINY_MODELS else "dit"


def reference_of(layout: str) -> str:
    """The 1-process run a layout's run must equal: same model, same routing."""
    kind = kind_of(layout)
    return f"{'' if kind == 'dit' else kind + '_'}{'routed_' if 'routed' in layout else ''}reference"


# Activation checkpointing rides along on two layouts (it must not change a single bit).
LAYOUT_TRAIN = {"hsdp": {"activation_checkpointing": "full"}, "fsdp_tp": {"activation_checkpointing": "selective"}}
LAYOUT_TRAIN.update(routed_fsdp=ROUTING, routed_tp=ROUTING, ldit_routed_tp={**ROUTING, "activation_checkpointing": "full"})


def final_weights(run, step=STEPS):
    """(model, ema) full state dicts of a run's checkpoint, from DCP shards or safetensors."""
    import tempfile

    from safetensors.torch import load_file

    ck = Path(run) / "checkpoints" / f"step-{step:08d}"
    ema = load_file(str(ck / "ema.safetensors"))
    if (ck / "dcp").is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(str(ck / "dcp"), f"{tmp}/full.pt")
            model = torch.load(f"{tmp}/full.pt", weights_only=False)["model"]
    else:
        model = load_file(str(ck / "model.safetensors"))
    return model, ema


def launch(nproc, *args, timeout=300):
    """Run `python -m torch.distributed.run --standalone --nproc_per_node N ARGS`; fail with its log tail."""
    import subprocess
    import sys

    from tests.subprocess_env import subprocess_env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *map(str, args)]
    env = subprocess_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # the workers import tests.*
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return proc
