"""Post-hoc EMA (EDM2's power-function EMA, arXiv 2312.02696), an option off by default
(`train.phema_stds`): profiles tracked during training (`tracker.PowerEMA`), their snapshots in
`OUTPUT_DIR/phema/` (`snapshots`), and EMA weights of any width rebuilt from them afterwards
(`posthoc.reconstruct`, the `dit ema` command). The arithmetic is torch-free (`profile`).

Names load on first use, so `dit --help` and config checks import no torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "PowerEMA": "tracker",
    "reconstruct": "posthoc",
    "phema_folder": "paths",
    "list_snapshots": "paths",
    "std_label": "paths",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
__all__ = sorted(_LAZY)
