"""`dit sample-ddp`: an FID batch (`samples.npz`, `arr_0` uint8 N×H×W×3, the ADM evaluator's
format) sampled by every rank of a torchrun launch, resumable chunk by chunk.

The chunks, their seeds and labels, resuming and the assembled .npz are `fid_batch`'s, which
`dit sample --npz` writes with too: the result depends neither on the number of ranks nor on the command.
"""

import os

from dit_trainer.errors import ConfigError

# Registering the command must not import torch (`dit --help` stays fast): `run` imports it.


def add_commands(subparsers) -> None:
    """Register `dit sample-ddp`."""
    from dit_trainer.sample.cli import add_prompt_arguments, add_sampling_arguments

    p = subparsers.add_parser(
        "sample-ddp",
        help="sample an FID batch on every rank of a torchrun launch (resumable .npz)",
        description="Sample N images for FID/IS with classifier-free guidance, split over the ranks of "
                    "`torchrun --nproc_per_node K -m dit_trainer sample-ddp ...` (or one process).",
    )
    p.add_argument("--ckpt", required=True, help="checkpoint dir, run dir, or DiT .pt/.safetensors (with --model)")
    p.add_argument("--npz", default="samples.npz", help="output .npz (default samples.npz)")
    p.add_argument("--num-samples", type=int, default=50000)
    p.add_argument("--batch-size", type=int, default=32, help="samples per chunk (one forward batch per rank)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="network precision while sampling")
    add_prompt_arguments(p, grid=False)
    add_sampling_arguments(p, cfg_scale=1.5)
    m = p.add_argument_group("guidance sweep: several settings, each measured (FID, sFID, IS, precision, recall)")
    m.add_argument("--guidance", nargs="+", default=None, metavar="SPEC",
                   help="one batch per SPEC, written beside --npz with the SPEC in its name: comma-separated "
                        "key=value over cfg, guide, w, interval (LO:HI), ema, steps, e.g. cfg=1.5 "
                        "guide=300,w=2 cfg=2,interval=0.3:5; unset keys come from the flags and the run")
    m.add_argument("--ref", default=None, help="measure each batch against this reference (.npz, or 'digits' "
                                               "with --network digits) and print one table")
    m.add_argument("--network", choices=("inception", "digits"), default="inception", help="feature network")
    m.add_argument("--inception-weights", default=None, help="Inception weight file (default: fetched once)")
    m.add_argument("--eval-batch-size", type=int, default=None, help="images per feature batch")
    m.add_argument("--pr-dtype", choices=("fp16", "fp32"), default="fp16", help="precision/recall distances")
    m.add_argument("--json", default=None, metavar="OUT",
                   help="the table's rows as JSON, rewritten as each is measured (default: beside --npz, "
                        "NPZ-sweep.json)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="how long a rank waits for the others (while rank 0 measures a batch or rebuilds a "
                        "post-hoc EMA) before the launch fails (default: the run's parallel.timeout, else 600)")
    p.set_defaults(func=run)


def _timeout(args):
    """The process group's timeout: --timeout, else the run's parallel.timeout (the trainer's), else its default."""
    import datetime

    from dit_trainer.config import ParallelConfig

    seconds = args.timeout
    if seconds is None:
        from dit_trainer import checkpoint
        from dit_trainer.errors import DitError

        try:  # every rank reads it before the group exists; a checkpoint that cannot be read fails later, in one line
            seconds = checkpoint.open(args.ckpt).config().parallel.timeout
        except (DitError, OSError, AttributeError):  # AttributeError: a weights file, which has no config
            seconds = ParallelConfig().timeout
    return datetime.timedelta(seconds=seconds)


def _dist(timeout=None):
    """This process's `fid_batch.Ranks`: one process unless torchrun started several, whose group waits `timeout`
    (a timedelta) for a missing rank."""
    import torch.distributed as dist

    from dit_trainer.parallel.dims import choose_backend
    from dit_trainer.parallel.process_group import init_process_group
    from dit_trainer.sample.fid_batch import ONE_PROCESS, Ranks

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        init_process_group(choose_backend(), timeout=timeout)
    if dist.is_initialized():
        def from_rank0(obj):
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]

        return Ranks(dist.get_rank(), dist.get_world_size(), dist.barrier, from_rank0)
    return ONE_PROCESS


def _resolved(ckpt) -> tuple:
    """(the checkpoint `--ckpt` names, absolute; the run folder it is the newest of, or None); `--ckpt`
    as given when there is none (opening it then says why on every rank)."""
    from dit_trainer import checkpoint
    from dit_trainer.errors import CheckpointError

    try:
        reader = checkpoint.open(ckpt)
    except CheckpointError:
        return ckpt, None
    return str(reader.path), str(reader.run) if reader.run is not None else None


def _open(found, flag):
    """The reader of `found` (what `_resolved` gave rank 0), retrying on the run's newest when rotation removes it."""
    from pathlib import Path

    from dit_trainer import checkpoint
    from dit_trainer.checkpoint.reader import CheckpointReader

    path, run = found
    if run is not None and Path(path).is_dir():
        return CheckpointReader(folder=path, run=run)
    return checkpoint.open(path, flag=flag)


def _prepare(args, reader, specs, device, ranks):
    """(Jobs of `specs`, the first's SamplingRun): every SPEC resolved and located, then the post-hoc EMA folders
    they need rebuilt (rank 0; the others wait), before any sampling."""
    from dit_trainer.sample.cli import prepare_sampling
    from dit_trainer.sample.run_settings import rebuild_missing
    from dit_trainer.sample.sweep import jobs

    planned = jobs(args, reader, specs)
    rebuild_missing([job.located for job in planned], ranks)
    first = planned[0]
    return planned, prepare_sampling(first.settings, reader, device, first.located, ranks.rank)


def run(args) -> int:
    """Sample this rank's missing chunks, then (rank 0) assemble the .npz and a preview PNG."""
    import torch

    from dit_trainer import checkpoint
    from dit_trainer.devices import resolve_device
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.sample.cli import check_args, load_vae, prepare_sampling
    from dit_trainer.sample.compile import resolve_sample_compile
    from dit_trainer.sample.fid_batch import rank_chunks, write_fid_batch

    check_args(args)
    if args.guidance is not None and args.ref is None:
        raise ConfigError("--guidance samples several settings to compare: add --ref REF (and --network) to measure "
                          "them")
    if args.timeout is not None and not (args.timeout > 0 and args.timeout < float("inf")):
        raise ConfigError(f"--timeout is {args.timeout}; it must be a positive number of seconds such as 600")
    if args.json is not None:
        from dit_trainer.fs import check_output_path

        check_output_path(args.json, "--json", ConfigError)
    sweep = args.guidance is not None or args.ref is not None
    specs = (args.guidance or [""]) if sweep else [None]
    ranks = _dist(_timeout(args))
    device = resolve_device(args.device, "--device")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    keep_freed_memory_on(device)
    # One checkpoint for every rank, even when the run saves a newer one while the ranks start.
    reader = _open(ranks.from_rank0(_resolved(args.ckpt) if ranks.rank == 0 else None), "--ckpt")
    planned, sampling = _prepare(args, reader, specs, device, ranks)
    agreed = ranks.from_rank0(str(reader.path))
    if str(reader.path) != agreed:
        # Rotation removed the checkpoint between two ranks' reads: all take rank 0's (one model per batch).
        reader = checkpoint.open(agreed, flag="--ckpt")
        planned, sampling = _prepare(args, reader, specs, device, ranks)
    first = planned[0]

    def sample_batch(job):
        run = sampling if job is first else prepare_sampling(job.settings, reader, device, job.located, ranks.rank)
        load_vae(run)
        settings = job.settings
        # Decided on this rank's whole share, not what is left of it, so a resumed run decides alike.
        share = rank_chunks(settings.num_samples, settings.batch_size, ranks.rank, ranks.world)
        compiled = resolve_sample_compile(settings.compile, run.model, len(share), settings.steps, device)
        return run, write_fid_batch(settings, run.reader, run, compiled, ranks)

    if not sweep:
        sample_batch(first)
        return 0
    from dit_trainer.sample.sweep import rows_path, run_sweep, table

    rows = run_sweep(args, planned, device, ranks, sample_batch)
    if rows:
        print(table(rows))
        print(f"rows: {rows_path(args)}")
    return 0
