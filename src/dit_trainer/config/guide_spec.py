"""What an autoguidance guide spec names (`sample.guide`, `eval.guide`, `--guide`, a sweep's `guide=`), torch-free.

Four forms, so that one `sample:` section works on every run of its config, whatever its length:

- `300`: the run's checkpoint of step 300 (`checkpoints/step-00000300`);
- `50%`: the run's checkpoint at that share of the main checkpoint's step, rounded down (50% of 1200: 600);
- `phema/std0.100@50%`: the run's post-hoc EMA of sigma_rel 0.100 at the snapshot nearest that share of the
  main checkpoint's step (the earlier of two as near; never past the main step), rebuilt from the snapshots
  when missing;
- anything else: a checkpoint or run folder (in a config, relative to the run folder).

`eval.guide` reads a share of `train.max_steps`, since a training-time FID keeps one guide for the whole run.
"""

import dataclasses
import math
import re
from fractions import Fraction
from typing import Optional

from dit_trainer.errors import ConfigError

_STEP = re.compile(r"^\d+$")
_SHARE = re.compile(r"^(\d+(?:\.\d+)?)%$")
_PHEMA = re.compile(r"^phema/std([0-9.]+)@(\d+(?:\.\d+)?)%$")
# The widest power-function EMA: exponent 0 (a mean over every step so far) has sigma_rel sqrt(1/12),
# and the width falls as the exponent grows, so the cubic that gives the exponent of a width has a
# positive root exactly for widths below this (phema/profile.py; tests hold the two equal).
PHEMA_MAX_STD = math.sqrt(1.0 / 12.0)


@dataclasses.dataclass(frozen=True)
class GuideSpec:
    """A parsed guide spec: exactly one of `step`, `share` (alone: a checkpoint; with `std`: a post-hoc EMA)
    or `path` is set."""

    text: str
    step: Optional[int] = None  # a checkpoint step of the run
    share: Optional[Fraction] = None  # a share of the main checkpoint's step (of train.max_steps for eval.guide)
    std: Optional[float] = None  # with `share`: the post-hoc EMA width sigma_rel
    path: Optional[str] = None  # a checkpoint or run folder

    @property
    def of_run(self) -> bool:
        """Whether the spec names the guide by the run's steps (a run folder is needed to find it)."""
        return self.path is None


def parse_guide(text, key: str = "--guide") -> GuideSpec:
    """The GuideSpec of `text`; a one-line ConfigError naming `key` for a share or width that cannot be."""
    text = str(text).strip()
    if _STEP.match(text):
        if int(text) < 1:
            raise ConfigError(f"{key} {text}: a run saves no checkpoint of step 0; name step 1 or later, a share "
                              f"such as 50%, or a folder")
        return GuideSpec(text, step=int(text))
    found = _PHEMA.match(text)
    if found:
        try:
            std = float(found.group(1))
        except ValueError:
            std = math.nan
        if not 0 < std < PHEMA_MAX_STD:
            raise ConfigError(f"{key} {text}: std{found.group(1)} is no post-hoc EMA width; sigma_rel must be in "
                              f"(0, {PHEMA_MAX_STD:.4f}), e.g. phema/std0.100@50%")
        return GuideSpec(text, share=_share(found.group(2), text, key), std=std)
    found = _SHARE.match(text)
    if found:
        return GuideSpec(text, share=_share(found.group(1), text, key))
    if text.startswith("phema/") and "@" in text:
        raise ConfigError(f"{key} {text}: a post-hoc EMA at a share of the run is written phema/stdS@P%, e.g. "
                          f"phema/std0.100@50%")
    return GuideSpec(text, path=text)


def _share(percent: str, text: str, key: str) -> Fraction:
    share = Fraction(percent) / 100
    if not 0 < share <= 1:
        raise ConfigError(f"{key} {text}: the share must lie in (0%, 100%] of the run, e.g. 50%")
    return share


def step_at(share: Fraction, step: int) -> int:
    """The step at `share` of `step`, rounded down, at least 1."""
    return max(1, math.floor(share * int(step)))


def nearest_step(share: Fraction, step: int, steps) -> Optional[int]:
    """Of `steps` up to `step`, the one nearest `share` of `step` (the earlier of two as near); None if none."""
    target = share * int(step)
    candidates = [s for s in steps if s <= step]
    return min(candidates, key=lambda s: (abs(s - target), s)) if candidates else None


def eval_guide_step(cfg) -> Optional[int]:
    """The checkpoint step `eval.guide` names (a step, or a share of train.max_steps), None for a folder or none;
    a one-line ConfigError for a post-hoc EMA (rebuilt after training, never there to guide it)."""
    if cfg.eval.guide is None:
        return None
    spec = parse_guide(cfg.eval.guide, "eval.guide")
    if spec.std is not None:
        raise ConfigError(f"eval.guide {spec.text} names a post-hoc EMA, which is rebuilt from snapshots after "
                          f"training; name a checkpoint of this run (a step such as 300, or a share such as 50%)")
    if spec.share is not None:
        return step_at(spec.share, cfg.train.max_steps)
    return spec.step


def keep_eval_guide(cfg) -> Optional[str]:
    """Make the run keep the checkpoint `eval.guide` names (when eval.every measures): a step past train.max_steps
    is refused in one line; one that rotation could remove (or that no save_steps reaches) joins
    checkpoint.keep_steps. Returns the note to print when it was added, else None."""
    step = eval_guide_step(cfg)
    if step is None or not cfg.eval.every:
        return None
    train, ckpt = cfg.train, cfg.checkpoint
    if step > train.max_steps:
        raise ConfigError(f"eval.guide {cfg.eval.guide} is step {step}, after train.max_steps {train.max_steps}: this "
                          f"run never saves it; name an earlier step or a share such as 50%")
    saved = step % ckpt.save_steps == 0 or step == train.max_steps
    if step in ckpt.keep_steps or (saved and ckpt.save_total_limit == 0):
        return None
    ckpt.keep_steps = sorted({*ckpt.keep_steps, step})
    return (f"note: checkpoint.keep_steps gains {step}, the step eval.guide {cfg.eval.guide} names, so that its "
            f"checkpoint is saved and kept for the training-time FID")
