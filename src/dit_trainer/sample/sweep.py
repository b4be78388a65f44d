"""`dit sample-ddp --guidance SPEC ... --ref REF`: one checkpoint sampled under several guidance
settings, each batch measured against one set of reference statistics, reported in one table.

A SPEC is comma-separated `key=value` pairs over the sampling flags: `cfg` (classifier-free weight),
`guide` (autoguidance's guide checkpoint: a step of the run or a path), `w` (autoguidance weight),
`interval` (`LO:HI` noise levels sigma, `inf` allowed), `ema` (a post-hoc EMA sigma_rel, or `none`),
`steps`. What a SPEC leaves out comes from the command's flags, then the run's `sample:` section.
Every SPEC is resolved (its settings, guide, post-hoc EMA, interval) before the first sample, so a bad
one is refused before any is sampled. Each batch is the one FID-batch writer's (every rank samples;
resumable; a finished batch of the same settings is reused), written beside `--npz` with the SPEC in
its name; each row is written to the table file (`--json`, else beside `--npz`) as soon as it is
measured, so a later failure loses none.
"""

import dataclasses
import json
import math
import re
from pathlib import Path

from dit_trainer.errors import ConfigError, DitError

# SPEC key -> (flag dest, parser)
_KEYS = {
    "cfg": ("cfg_scale", float),
    "guide": ("guide", str),
    "w": ("guide_scale", float),
    "interval": ("guidance_interval", lambda v: [float(x) for x in v.split(":")]),
    "ema": ("ema_std", str),
    "steps": ("steps", int),
}
METRICS = ("fid", "sfid", "inception_score", "precision", "recall")


def parse_spec(text: str) -> dict:
    """The flag values a SPEC sets (`cfg=1.5,guide=300,w=2`); a one-line error naming the SPEC otherwise."""
    out = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in _KEYS:
            raise ConfigError(f"--guidance {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(_KEYS)}")
        dest, parse = _KEYS[key]
        try:
            out[dest] = parse(value)
        except ValueError:
            raise ConfigError(f"--guidance {text!r}: {key}={value!r} is not a valid value") from None
    if "guidance_interval" in out and len(out["guidance_interval"]) != 2:
        raise ConfigError(f"--guidance {text!r}: interval must be LO:HI, e.g. 0.3:5 or 0.3:inf")
    return out


def batch_path(npz, text: str) -> Path:
    """Where a SPEC's batch goes: beside `npz`, the SPEC in its name."""
    npz = Path(npz)
    name = re.sub(r"[^A-Za-z0-9.=_-]+", "_", text).strip("_") or "recommended"
    return npz.with_name(f"{npz.stem}-{name}{npz.suffix}")


def describe(settings) -> str:
    """The guidance a SampleSettings samples with, in a SPEC's words."""
    parts = [f"cfg={settings.cfg_scale:g}"]
    if settings.guide is not None:
        parts += [f"guide={settings.guide}", f"w={settings.guide_scale:g}"]
    lo, hi = settings.guidance_interval or (0, math.inf)
    if lo > 0 or not math.isinf(hi):  # (0, inf] holds every noise level: no interval
        parts.append(f"interval={lo:g}:{'inf' if math.isinf(hi) else f'{hi:g}'}")
    if settings.ema_std is not None:
        parts.append(f"ema={settings.ema_std:g}")
    return ",".join(parts)


@dataclasses.dataclass(frozen=True)
class Job:
    """One batch to sample: the SPEC as typed ("" for the flags and the run alone), its settings, where its
    checkpoints are (`run_settings.Located`)."""

    spec: str
    settings: object
    located: object


def jobs(args, reader, specs) -> list:
    """A Job per SPEC of `specs` ("": the flags and the run alone, beside `--npz`; None: the same into `--npz`
    itself), every one resolved and located before any is sampled; a one-line error naming the SPEC otherwise."""
    from dit_trainer.sample.run_settings import locate
    from dit_trainer.sample.settings import check_flags, given_of, resolve

    base = given_of(args)
    recommended = getattr(reader.config(), "sample", None)
    out = []
    for text in specs:
        given = dict(base) if text is None else {**base, **parse_spec(text), "npz": str(batch_path(args.npz, text))}
        try:
            check_flags(given)
            settings = resolve(given, recommended, args.release_cfg_scale)
            out.append(Job(text or "", settings, locate(settings, reader)))
        except DitError as err:
            if not text:
                raise
            raise type(err)(f"--guidance {text!r}: {err}") from None
    return out


def rows_path(args) -> Path:
    """The table file: `--json`, else beside `--npz` (`s.npz`: `s-sweep.json`)."""
    npz = Path(args.npz)
    return Path(args.json) if args.json else npz.with_name(f"{npz.stem}-sweep.json")


def run_sweep(args, jobs, device, ranks, sample_batch) -> list:
    """Sample every Job with `sample_batch(job)` -> (SamplingRun, npz) on every rank, then measure each on rank 0
    and rewrite the table file with the rows so far; one row per Job there (an empty list elsewhere)."""
    import numpy as np

    from dit_trainer.fs import staged_file

    measure = _measurer(args, device) if ranks.rank == 0 else None
    rows, table_file = [], rows_path(args)
    for job in jobs:
        sampling, npz = sample_batch(job)
        if measure is None:
            continue
        result = measure(npz)
        with np.load(npz) as f:
            nfe = float(f["nfe"]) if "nfe" in f.files else None
        rows.append({"spec": job.spec or "recommended", "guidance": describe(job.settings), "nfe": nfe,
                     "ckpt": str(sampling.reader.path), "samples": str(npz), "num_samples": result["num_samples"],
                     **{k: result[k] for k in METRICS}})
        # Whole after every row, under a temporary name: a later SPEC that fails loses no measured row.
        with staged_file(table_file, ConfigError) as tmp:
            tmp.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def _measurer(args, device):
    """measure(npz) -> the five metrics, against reference statistics fitted once."""
    from dit_trainer.evaluate.evaluator import evaluate, load_network, reference

    network = load_network(args.network, args.inception_weights, device, progress=not args.no_progress)
    batch = args.eval_batch_size or (512 if network.name == "digits" else 64)
    stats = reference(args.ref, network, batch, device=device, progress=not args.no_progress)

    def measure(npz):
        return evaluate(npz, stats, network, batch_size=batch, device=device, progress=not args.no_progress,
                        pr_dtype=args.pr_dtype)

    return measure


def table(rows) -> str:
    """The sweep as a markdown table."""
    head = ["guidance", "NFE", "FID", "sFID", "IS", "precision", "recall"]
    fmt = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":--"] + ["--:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [r["guidance"], fmt(r["nfe"], 0), fmt(r["fid"]), fmt(r["sfid"]), fmt(r["inception_score"]),
                 fmt(r["precision"], 3), fmt(r["recall"], 3)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
