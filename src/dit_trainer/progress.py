"""Progress bars that suit where their output goes.

On a terminal (or in a notebook) a bar redraws in place, as tqdm is asked. Written to a file (SLURM,
CI, `nohup`) each redraw is one more carriage-returned line of the log, hundreds of kB over a run, so
there a bar redraws at most every LOG_INTERVAL seconds, and a bar whose caller prints its own
progress lines (training's periodic log lines) is not drawn at all: those lines stay as they are.
Every progress bar of the package is made here.
"""

import sys

LOG_INTERVAL = 30.0  # seconds between a bar's redraws when its output is not a terminal


def redraws_in_place(file=None) -> bool:
    """Whether a bar written to `file` (None: tqdm's default, stderr) is seen redrawn in place: a
    terminal, or the widget tqdm.auto makes in a notebook."""
    stream = sys.stderr if file is None else file
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    from tqdm.autonotebook import tqdm as chosen
    from tqdm.std import tqdm as text

    return chosen is not text


def progress_bar(iterable=None, logged: bool = False, **kwargs):
    """tqdm.auto's bar over `iterable` with tqdm's `kwargs`; where its output is not a terminal, redrawn
    at most every LOG_INTERVAL seconds, or off when `logged` (the caller prints progress lines itself)."""
    from tqdm.auto import tqdm

    if not kwargs.get("disable") and not redraws_in_place(kwargs.get("file")):
        if logged:
            return tqdm(iterable, **{**kwargs, "disable": True})
        slow = max(float(kwargs.get("mininterval") or 0.0), LOG_INTERVAL)
        # maxinterval too: tqdm's monitor thread redraws a bar idle for maxinterval seconds.
        kwargs.update(mininterval=slow, maxinterval=max(float(kwargs.get("maxinterval") or 0.0), slow),
                      dynamic_ncols=False)
    return tqdm(iterable, **kwargs)
