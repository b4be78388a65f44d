"""Saving and loading a training run's state under any layout: `Checkpointer`.

Unsharded runs (one process, DDP) write full files from rank 0; sharded ones (FSDP, TP, PP or
`checkpoint.sharded`) write DCP shards plus the full EMA that sampling reads. Either kind loads
under any layout: shards reshard N -> M, full files are scattered into shards.
"""

import functools

import torch

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.checkpoint.phema_state import PHEMA_FILE, flatten, nest
from dit_trainer.errors import CheckpointError
from dit_trainer.fs import tree_bytes, warn_low_space
from dit_trainer.parallel.utils import any_rank, barrier


class Checkpointer:
    """The model parts, optimizer and EMA of a run, saved to and loaded from `output_dir/checkpoints`."""

    def __init__(self, output_dir, model_parts, optimizer, ema, dims, device, sharded: bool, keep: int, keep_steps=(),
                 phema=None):
        """`sharded`: write DCP shards (any sharded layout, or `checkpoint.sharded`); `keep`: how many
        of the newest checkpoints rotation keeps (0 keeps all); `keep_steps`: steps it keeps besides;
        `phema`: the post-hoc EMA profiles, or None."""
        self.output_dir, self.model_parts, self.optimizer, self.ema = output_dir, list(model_parts), optimizer, ema
        self.phema = phema
        self.dims, self.device, self.sharded, self.keep = dims, device, sharded, keep
        self.keep_steps = tuple(keep_steps)
        # The kernel choice (fused, foreach) belongs to this layout's parameters, not to the writer's.
        self._kernels = {k: optimizer.param_groups[0][k] for k in ("fused", "foreach")}
        # Names of checkpoints known whole (written or verified by this process): rotation counts them
        # without hashing them again. `last_good`: the newest of them, the one a failure leaves intact.
        self.whole, self.last_good = set(), None

    def mark_good(self, path) -> None:
        """Record checkpoint `path` as verified and loaded (a resume), so rotation keeps it."""
        if path.parent.resolve() == ckpt.checkpoint_root(self.output_dir).resolve():
            self.whole.add(path.name)  # a checkpoint of another run folder says nothing of this one's
        self.last_good = path

    def _needed(self) -> int:
        """About the bytes the next checkpoint takes: the previous one's size (warned about when the disk lacks it)."""
        last = ckpt.latest_checkpoint(self.output_dir)
        needed = tree_bytes(last) if last is not None else 0
        warn_low_space(ckpt.checkpoint_root(self.output_dir), needed, "a checkpoint")
        return needed

    def _model(self):
        model = self.model_parts[0]
        return getattr(model, "module", model)  # DDP's wrapper holds the model under .module

    def save(self, step: int, trainer_state: dict, config_text: str):
        """Write checkpoint `step` through the one write path; returns its final path (on rank 0 of an
        unsharded run, on every rank of a sharded one; all ranks call it)."""
        main = self.dims.is_main
        if not self.sharded:
            if not main:
                return None
            files = {
                "model.safetensors": self._model().state_dict(),
                "ema.safetensors": self.ema.state_dict(),
                "optimizer.pt": self.optimizer.state_dict(),
                "trainer_state.pt": trainer_state,
                "config.yaml": config_text,
            }
            if self.phema is not None:
                files[PHEMA_FILE] = flatten(self.phema.state_dict())
            shards = writers = None  # rank 0 writes alone
        else:
            files = {"config.yaml": config_text}
            shards = functools.partial(self._write_shards, trainer_state)
            writers = ckpt.Writers(main, functools.partial(any_rank, device=self.device), barrier)
        self.last_good = ckpt.save_checkpoint(self.output_dir, step, files, self.keep, self.whole,
                                              self._needed() if main else None, shards=shards, writers=writers,
                                              keep_steps=self.keep_steps)
        return self.last_good

    def _write_shards(self, trainer_state: dict, folder) -> None:
        """Every rank's DCP shards, then the full EMA that sampling and the converters read (one
        all-gather per tensor)."""
        from torch.distributed.checkpoint.api import CheckpointException

        from dit_trainer.checkpoint import sharded

        try:
            sharded.save_sharded(folder / "dcp", self.model_parts, self.optimizer, self.ema, trainer_state,
                                 phema=self.phema)
        except CheckpointException as err:  # a BaseException: reported as the write error it wraps
            failures = list(getattr(err, "failures", {}).values())
            cause = failures[0][0] if failures and isinstance(failures[0], tuple) else None
            raise cause if isinstance(cause, ckpt.WRITE_ERRORS) else RuntimeError(str(cause or err)) from None
        sharded.export_safetensors(folder / "ema.safetensors", self.ema.state_dict(), self.model_parts, self.dims)

    def load(self, path) -> dict:
        """Load weights, EMA and optimizer from checkpoint folder `path` (DCP shards under any layout,
        or full files); returns its trainer state."""
        try:
            state = self._load(path)
            for group in self.optimizer.param_groups:
                group.update(self._kernels)
        except CheckpointError:
            raise
        except (KeyError, ValueError, TypeError, RuntimeError, OSError) as err:
            # A file that parsed but holds the wrong things (a state dict of another model, say).
            text = str(err).strip().splitlines()
            raise CheckpointError(f"{path}: cannot be loaded ({type(err).__name__}: {text[-1] if text else ''})") from None
        barrier()
        return state

    def _load(self, path) -> dict:
        if (path / "dcp").is_dir() or self.sharded:
            from dit_trainer.checkpoint import sharded

            if (path / "dcp").is_dir():
                return sharded.load_sharded(path / "dcp", self.model_parts, self.optimizer, self.ema, phema=self.phema)
            sharded.load_full_into_sharded(path, self.model_parts, self.optimizer, self.ema, phema=self.phema)
            return ckpt.load_pt(path / "trainer_state.pt")
        model_file = path / "model.safetensors"
        # A run keeps its weights, EMA and moments in one dtype: another in the file was written by
        # another tool, and a cast would hide it (int32 turns weights into whole numbers).
        ckpt.load_into(self._model(), ckpt.load_safetensors(model_file), model_file, exact_dtype=True)
        ema = ckpt.load_safetensors(path / "ema.safetensors")
        self._same_dtypes({k: v.dtype for k, v in self.ema.shadow.items()}, ema, path / "ema.safetensors")
        self.ema.load_state_dict(ema)
        if self.phema is not None:
            # Whether the checkpoint tracked these profiles at all was checked before (train/resume.py).
            profiles = ckpt.load_safetensors(path / PHEMA_FILE)
            self._same_dtypes({k: v.dtype for k, v in flatten(self.phema.state_dict()).items()}, profiles, path / PHEMA_FILE)
            self.phema.load_state_dict(nest(profiles))
        optim = ckpt.load_pt(path / "optimizer.pt")
        self._check_optimizer_dtypes(optim, path / "optimizer.pt")
        self.optimizer.load_state_dict(optim)
        return ckpt.load_pt(path / "trainer_state.pt")

    @staticmethod
    def _same_dtypes(want: dict, state: dict, source) -> None:
        problem = ckpt.dtype_mismatch(want, state, exact=True)
        if problem:
            raise CheckpointError(f"{source}: {problem}; the file was changed or written by another tool, use "
                                  "another checkpoint")

    def _check_optimizer_dtypes(self, state, source) -> None:
        """Each moment of `optimizer.pt` in its parameter's dtype (the optimizer would cast it silently)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        entries = state.get("state", {}) if isinstance(state, dict) else {}
        for index, moments in entries.items() if isinstance(entries, dict) else ():
            if isinstance(index, int) and 0 <= index < len(params) and isinstance(moments, dict):
                want = {f"state.{index}.{k}": params[index].dtype for k in moments if k != "step"}
                self._same_dtypes(want, {f"state.{index}.{k}": v for k, v in moments.items()}, source)

    def weights_finite(self) -> bool:
        """Whether every weight and EMA value this rank holds is finite."""
        tensors = [p for part in self.model_parts for p in part.parameters()] + list(self.ema.shadow.values())
        for t in tensors:
            t = t.to_local() if hasattr(t, "to_local") else t
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return False
        return True

    def ema_model(self, build_model, everywhere: bool = False):
        """A plain eval-mode model (from `build_model()`) holding the EMA weights on rank 0 (on every
        rank with `everywhere`, not under pipeline stages), None elsewhere; a collective."""
        from dit_trainer.checkpoint.sharded import gather_full

        full = gather_full(self.ema.state_dict(), self.model_parts, self.dims, everywhere)
        if not self.dims.is_main and not everywhere:
            return None
        # Building initialises weights from the global RNG, which the run's data order depends on.
        with torch.random.fork_rng(devices=[]):
            model = build_model()
        model.load_state_dict(full, strict=True)
        return model.to(self.device).eval().requires_grad_(False)
