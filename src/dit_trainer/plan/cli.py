"""`dit plan`: which layouts of a model fit a machine, and which is fastest, before launching.

    dit plan --model LargeDiT-7B/2 --gpus 16 --gpus-per-node 8 --gpu-memory 80GiB --hardware h100
    dit plan --config configs/parallel_fsdp.yaml --image-size 512 --global-batch-size 256 --gpus 8

Takes what `dit train` takes (a config and any `--section.field value`) plus the machine. Nothing
is allocated: the model family's cost model is arithmetic (`ModelSpec.costs_fn`).
"""


def add_commands(sub) -> None:
    """Register `dit plan`."""
    p = sub.add_parser(
        "plan",
        help="rank parallel layouts by predicted memory and speed for a machine",
        description="Price every layout (dp_replicate x dp_shard x tp x pp, schedule, micro-batches, activation "
                    "checkpointing, compile) of a model on a machine and print them fastest first, with per-rank "
                    "peak memory and step time; layouts that do not fit are listed with what overflows. Any config "
                    "key can be set as in dit train (--section.field VALUE). --train.activation_checkpointing or "
                    "--train.compile given explicitly are kept; the search chooses the rest.",
        usage="dit plan [-h] [--config FILE] [--model NAME] [--gpus N] [--gpus-per-node G] [--gpu-memory SIZE] "
              "[--hardware NAME|FILE] [--section.field VALUE ...]",
        allow_abbrev=False,
    )
    p.add_argument("--config", default=None, help="YAML or JSON config, as for dit train")
    p.add_argument("--model", default=None, help="model name (model.name), e.g. DiT-XL/2 or LargeDiT-7B/2")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side in pixels; the latents are 1/f of it, f the VAE's downsampling (8 for the SD VAEs; "
                        "read from data.path's manifest or a data.vae folder) (sets model.input_size)")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="images per optimizer step (train.global_batch_size)")
    p.add_argument("--gpus", type=int, default=1, help="devices (processes) in all")
    p.add_argument("--gpus-per-node", type=int, default=None, help="devices per node (default: --gpus, at most 8)")
    p.add_argument("--gpu-memory", default=None, help="memory of one device, e.g. 80GiB (default: the profile's)")
    p.add_argument("--hardware", default="h100",
                   help="profile: h100, h200, a100, cpu, or a YAML written by benchmarks/hardware_profile.py")
    p.add_argument("--top", type=int, default=10, help="rows of the table")
    p.add_argument("--unfit", type=int, default=5, help="layouts that do not fit to list")
    p.set_defaults(func=run, accepts_overrides=True)


def run(args) -> int:
    """Load the config like dit train, price every layout, print the ranking."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec
    from dit_trainer.plan.hardware import parse_memory
    from dit_trainer.plan.latents import PlanShapes
    from dit_trainer.plan.report import render
    from dit_trainer.plan.search import make_request, model_costs, plan_layouts

    from dit_trainer.errors import ConfigError

    for flag in ("gpus_per_node", "global_batch_size", "image_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:  # 0 would silently mean "the default"
            raise ConfigError(f"--{flag.replace('_', '-')} is {value}; it must be 1 or more (leave it out for the "
                              "default)")
    overrides = list(args.overrides)
    if args.model:
        overrides = ["--model.name", args.model, *overrides]
    if args.global_batch_size is not None:
        overrides = ["--train.global_batch_size", str(args.global_batch_size), *overrides]
    # The latents' channels and side come from the data or VAE, as dit train takes them.
    cfg = build_config(args.config, overrides, shapes=PlanShapes(args.image_size))
    memory = parse_memory(args.gpu_memory) if args.gpu_memory else 0.0
    request = make_request(cfg, args.gpus, args.gpus_per_node or 0, args.hardware, memory)
    plans = plan_layouts(request)
    print(render(request, model_costs(cfg), plans, args.top, args.unfit))
    return 0 if any(p.fits for p in plans) else 1

