"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and full-weight export.

Every rank writes its own shards of the model, the EMA and the optimizer; DCP's metadata records
where each shard sits in the full tensor, so a checkpoint written under one layout (2 ranks of
FSDP, say) loads under any other (1 rank, or 4 ranks of FSDP x TP). Tensor parallelism regroups
the rows of fused projections per rank (`parallel.tp.regroup_fused_rows`); checkpoints always hold
the released layout, so they never depend on the tp degree they were written with.
"""

import contextlib
import io
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn

from dit_trainer.checkpoint.phema_state import PHEMA_FILE, nest
from dit_trainer.checkpoint.pt import weights_only_refusal
from dit_trainer.errors import CheckpointError
from dit_trainer.parallel.tp import fused_row_layouts, fused_rows_to_full_layout, fused_rows_to_tp_layout
from dit_trainer.parallel.utils import full, is_dtensor


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Flattened optimizer keys ("state.blocks.3.attn.proj.weight.exp_avg") do not depend on how
    # parameters are grouped into optimizers, so pipeline layouts can differ between save and load.
    return StateDictOptions(flatten_optimizer_state_dict=True, **kwargs)


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _fused_keys(model_parts) -> dict:
    """Parameter FQN -> (groups, tp) for every regrouped fused weight and bias."""
    out = {}
    for part in model_parts:
        out.update(fused_row_layouts(part))
    return out


def _fused_layout(key: str, fused: dict):
    """(groups, tp) if `key` is a regrouped tensor (model/EMA key or a flattened optimizer state)."""
    if key in fused:
        return fused[key]
    if key.startswith("state."):
        for fqn, layout in fused.items():
            if key.startswith(f"state.{fqn}."):
                return layout
    return None


def _relayout(value, layout, fn):
    """Apply a row permutation to the full tensor and re-shard it exactly as it was."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    if not is_dtensor(value):
        return fn(value, *layout)
    from torch.distributed.tensor import distribute_tensor

    # Gathers one fused tensor at a time: the peak is one full projection, not the model.
    moved = fn(value.full_tensor(), *layout)
    return distribute_tensor(moved, value.device_mesh, value.placements, src_data_rank=None)


def _relayout_all(sd: dict, fused: dict, fn) -> dict:
    if not fused:
        return sd
    return {k: (_relayout(v, lay, fn) if (lay := _fused_layout(k, fused)) else v) for k, v in sd.items()}


def _groups(model_parts, optimizers):
    """(module, optimizer, strip) triples: one optimizer over several stages sees them as one ModuleList."""
    optimizers = _as_list(optimizers)
    if len(optimizers) == 1 and len(model_parts) > 1:
        return [(nn.ModuleList(model_parts), optimizers[0], True)]
    if optimizers and len(optimizers) != len(model_parts):
        raise ValueError("pass one optimizer, or one per model part")
    return [(part, optimizers[i] if optimizers else None, False) for i, part in enumerate(model_parts)]


def _strip(key: str) -> str:
    """Drop the ModuleList index: "0.blocks.3.x" -> "blocks.3.x", "state.0.blocks.3.x.exp_avg" -> "state.blocks.3.x.exp_avg"."""
    head, _, rest = key.partition(".")
    if head in ("state", "param_groups"):
        return f"{head}.{rest.partition('.')[2]}"
    return rest


def _state_dicts(model_parts, optimizers):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = {}, {}
    for module, optimizer, strip in _groups(model_parts, optimizers):
        if optimizer is not None:
            m, o = get_state_dict(module, optimizer, options=_options())
        else:
            m, o = get_model_state_dict(module, options=_options()), {}
        model_sd.update({_strip(k) if strip else k: v for k, v in m.items()})
        optim_sd.update({_strip(k) if strip else k: v for k, v in o.items()})
    return model_sd, optim_sd


@contextlib.contextmanager
def _single_process_quiet():
    """Silence DCP's "assuming the intent is to save/load in a single process" when no process group exists."""
    with warnings.catch_warnings():
        if not (dist.is_available() and dist.is_initialized()):
            # One process is what we mean then (a 1-process run or resume); torch warns at every checkpoint.
            warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized, "
                                    r"assuming the intent is to (save|load) in a single process", category=UserWarning)
        yield


def save_sharded(path, model_parts, optimizers=None, ema=None, trainer_state=None, async_save=False, process_group=None,
                 phema=None):
    """Write model, optimizer, EMA, post-hoc EMA profiles and trainer state shards under `path` (a directory); all ranks call it.

    With `async_save` the tensors are staged to CPU and written in the background; the returned
    future must be waited on before the next save.
    """
    model_parts = _as_list(model_parts)
    fused = _fused_keys(model_parts)
    model_sd, optim_sd = _state_dicts(model_parts, optimizers)
    state = {"model": _relayout_all(model_sd, fused, fused_rows_to_full_layout)}
    if optim_sd:
        state["optimizer"] = _relayout_all(optim_sd, fused, fused_rows_to_full_layout)
    if ema is not None:
        state["ema"] = _relayout_all(ema.state_dict(), fused, fused_rows_to_full_layout)
    if phema is not None:
        state["phema"] = {k: _relayout_all(sd, fused, fused_rows_to_full_layout) for k, sd in phema.state_dict().items()}
    if trainer_state is not None:
        # One pickled blob: RNG states and counters are the same on every rank (the global batch is
        # drawn identically everywhere), so DCP keeps a single copy whatever the world size.
        buf = io.BytesIO()
        torch.save(trainer_state, buf)
        buf.seek(0)
        state["trainer"] = buf
    with _single_process_quiet():
        if async_save:
            return dcp.async_save(state, checkpoint_id=str(path), process_group=process_group)
        dcp.save(state, checkpoint_id=str(path), process_group=process_group)
    return None


def _safe_load(state: dict, path) -> None:
    """dcp.load of `state` from `path` through the restricted reader, failures as one line."""
    from pathlib import Path

    from torch.distributed.checkpoint.api import CheckpointException

    from dit_trainer.checkpoint.files import dtype_mismatch
    from dit_trainer.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, read_metadata_file

    # Read first, so a refused file is our one line, not torch's logged tracebacks of its fallbacks.
    recorded = read_metadata_file(Path(path) / ".metadata").state_dict_metadata
    sections = {"model": state.get("model"), "ema": state.get("ema"),
                **{f"phema.{label}": sd for label, sd in (state.get("phema") or {}).items()}}
    for section, tensors in sections.items():
        want = {f"{section}.{k}": v.dtype for k, v in (tensors or {}).items() if isinstance(v, torch.Tensor)}
        saved = {k: torch.empty(0, dtype=recorded[k].properties.dtype) for k in want
                 if getattr(getattr(recorded.get(k), "properties", None), "dtype", None) is not None}
        problem = dtype_mismatch(want, saved, exact=True)
        if problem:  # DCP would cast into the run's tensors without a word
            raise CheckpointError(f"{path}: {problem}; the checkpoint was changed or written by another tool, use "
                                  "another checkpoint")

    try:
        # Never torch's own reader: it unpickles `.metadata` and byte items without restriction.
        with _single_process_quiet():
            dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
        raise CheckpointError(f"cannot load sharded checkpoint {path}: {_first_cause(err)}") from None


def load_sharded(path, model_parts, optimizers=None, ema=None, load_trainer_state=True, phema=None):
    """Load a checkpoint written by `save_sharded` under any layout into this one; returns the trainer state."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    model_parts = _as_list(model_parts)
    optimizers = _as_list(optimizers)
    fused = _fused_keys(model_parts)
    model_sd, optim_sd = _state_dicts(model_parts, optimizers)

    def template(sd):
        # Fused tensors receive the released layout into scratch copies, converted below.
        return {k: (v.detach().clone() if _fused_layout(k, fused) and isinstance(v, torch.Tensor) else v) for k, v in sd.items()}

    state = {"model": template(model_sd)}
    if optim_sd:
        state["optimizer"] = template(optim_sd)
    if ema is not None:
        state["ema"] = template(ema.state_dict())
    if phema is not None:
        state["phema"] = {label: template(sd) for label, sd in phema.state_dict().items()}
    if load_trainer_state:
        state["trainer"] = io.BytesIO()
    _safe_load(state, path)

    model_sd = _relayout_all(state["model"], fused, fused_rows_to_tp_layout)
    optim_sd = _relayout_all(state.get("optimizer", {}), fused, fused_rows_to_tp_layout)
    for module, optimizer, strip in _groups(model_parts, optimizers):
        # Keys back in the module's own naming (ModuleList index included when stages share an optimizer).
        own = {}
        for name, _ in list(module.named_parameters()) + list(module.named_buffers()):
            own[_strip(name) if strip else name] = name
        part_model = {own[k]: v for k, v in model_sd.items() if k in own}
        if optimizer is not None:
            part_optim = {}
            for k, v in optim_sd.items():
                head, _, rest = k.partition(".")
                fqn, _, leaf = rest.rpartition(".")
                if fqn in own:
                    part_optim[f"{head}.{own[fqn]}.{leaf}"] = v
            set_state_dict(module, optimizer, model_state_dict=part_model, optim_state_dict=part_optim, options=_options())
        else:
            set_model_state_dict(module, part_model, options=_options())
    if ema is not None:
        ema.load_state_dict(_relayout_all(state["ema"], fused, fused_rows_to_tp_layout))
    if phema is not None:
        phema.load_state_dict({label: _relayout_all(sd, fused, fused_rows_to_tp_layout) for label, sd in state["phema"].items()})
    trainer = state.get("trainer")
    if isinstance(trainer, io.BytesIO):
        # DCP fills the buffer with what save_sharded pickled: counters, RNG states, plain containers.
        trainer.seek(0)
        try:
            trainer = torch.load(trainer, map_location="cpu", weights_only=True) if trainer.getbuffer().nbytes else None
        except Exception as err:
            raise CheckpointError(f"{path}: trainer state refused: it {weights_only_refusal(err)}") from None
    return trainer if load_trainer_state else None


def read_sharded_model(folder) -> dict:
    """The training weights (the DCP `model` entry) of sharded checkpoint `folder`, as a full state dict.

    Checked as `load_weights` checks `model.safetensors`: the shards against the manifest, then finiteness.
    """
    from pathlib import Path

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from dit_trainer.checkpoint.files import verify_file
    from dit_trainer.checkpoint.safe_dcp import read_metadata_file

    folder = Path(folder)
    if not (folder / "dcp" / ".metadata").is_file():
        raise CheckpointError(f"{folder} is no sharded checkpoint (no dcp/.metadata); pass a checkpoints/step-* folder "
                              "of a run with checkpoint.sharded")
    for path in sorted((folder / "dcp").iterdir()):
        if path.is_file():
            verify_file(folder, f"dcp/{path.name}")
    # Checkpoints hold the released layout in full tensors, so the shapes DCP recorded make the
    # template: no model has to be built to read them.
    recorded = read_metadata_file(folder / "dcp" / ".metadata").state_dict_metadata
    weights = {key.removeprefix("model."): torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
               for key, meta in recorded.items() if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    _safe_load({"model": weights}, folder / "dcp")
    for key, value in weights.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{folder / 'dcp'}: model.{key} holds NaN or inf; use another checkpoint")
    return weights


def load_sharded_model(folder, model) -> None:
    """Load the training weights of sharded checkpoint `folder` (`read_sharded_model`) into a plain model."""
    from dit_trainer.checkpoint.files import load_into

    load_into(model, read_sharded_model(folder), folder)


def _first_cause(err: BaseException) -> str:
    """One line out of DCP's exception, which wraps a traceback per failing rank."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        for value in failures.values():
            inner = value[0] if isinstance(value, tuple) else value
            if isinstance(inner, BaseException):
                if isinstance(inner, CheckpointError):
                    return str(inner)
                text = str(inner).strip().splitlines()
                return f"{type(inner).__name__}: {text[-1]}" if text else f"{type(inner).__name__} (a shard is truncated or damaged)"
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__


def load_full_into_sharded(path, model_parts, optimizer, ema=None, phema=None) -> None:
    """Resume a sharded layout from full files (`model.safetensors`, `ema.safetensors`, `optimizer.pt`, `phema.safetensors`).

    The optimizer file of a 1-process run is keyed by position among the trainable parameters;
    positions are mapped to names through the full model's parameter order, which pipeline
    stages keep in their FQNs.
    """
    from pathlib import Path

    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    from dit_trainer.checkpoint.files import load_safetensors as load_file

    path = Path(path)
    model_parts = _as_list(model_parts)
    fused = _fused_keys(model_parts)

    def to_tp(sd):
        return {k: (fused_rows_to_tp_layout(v, *fused[k]) if k in fused else v) for k, v in sd.items()}

    full = StateDictOptions(full_state_dict=True, strict=False)
    model_sd = to_tp(load_file(path / "model.safetensors"))
    for part in model_parts:
        own = {n for n, _ in part.named_parameters()}
        set_model_state_dict(part, {k: v for k, v in model_sd.items() if k in own}, options=full)
    if ema is not None:
        ema_sd = to_tp(load_file(path / "ema.safetensors"))
        ema.load_state_dict({k: v for k, v in ema_sd.items() if k in ema.shadow}, strict=False)
    if phema is not None:
        phema.load_state_dict({label: to_tp(sd) for label, sd in nest(load_file(path / PHEMA_FILE)).items()})
    if optimizer is None or not (path / "optimizer.pt").is_file():
        return
    from dit_trainer.checkpoint.files import load_pt

    osd = load_pt(path / "optimizer.pt")
    names = _full_trainable_names(path)
    state = {}
    for idx, st in osd["state"].items():
        fqn = names[int(idx)]
        state[fqn] = {k: (fused_rows_to_tp_layout(v, *fused[fqn]) if fqn in fused and torch.is_tensor(v) and v.dim() else v)
                      for k, v in st.items()}
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in osd["param_groups"]]
    for module, opt, strip in _groups(model_parts, optimizer):
        own = {(_strip(n) if strip else n): n for n, _ in module.named_parameters()}
        sub = {
            "state": {own[k]: v for k, v in state.items() if k in own},
            "param_groups": [{**g, "params": [own[p] for p in g["params"] if p in own]} for g in groups],
        }
        set_optimizer_state_dict(module, opt, sub, options=full)


def _full_trainable_names(path) -> list:
    """Trainable parameter names of the full model described by the checkpoint's config, in order."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    cfg = build_config(str(path / "config.yaml"))
    with torch.device("meta"):
        model = get_spec(cfg.model.name).build_model_fn(cfg)
    return [n for n, p in model.named_parameters() if p.requires_grad]


# ---------------------------------------------------------------------------------------------
# Full weights


def gather_full(tensors: dict, model_parts, dims=None, everywhere: bool = False) -> dict:
    """Full tensors in the released layout on global rank 0 (every rank must call it); {} elsewhere.

    `everywhere` keeps them on every rank too, which costs nothing more without pipeline stages
    (each rank assembles the full tensors anyway); with stages it is refused."""
    if everywhere and dims is not None and dims.pp_enabled:
        raise ValueError("full weights on every rank are not gathered across pipeline stages")
    fused = _fused_keys(_as_list(model_parts))
    out = {}
    for key, value in tensors.items():
        value = full(value.detach())
        if key in fused:
            value = fused_rows_to_full_layout(value, *fused[key])
        out[key] = value.cpu().contiguous()
    if dims is not None and dims.pp_enabled:
        # Each stage holds its own blocks; the first data/tensor-parallel rank of each stage sends them.
        if dims.dp_rank == 0 and dims.tp_rank == 0:
            parts = [None] * dims.pp if dims.pp_rank == 0 else None
            dist.gather_object(out, parts, group=dims.mesh["pp"].get_group(), group_dst=0)
            out = {k: v for p in parts for k, v in p.items()} if dims.pp_rank == 0 else {}
        else:
            out = {}
    if dist.is_initialized() and dist.get_rank() != 0 and not everywhere:
        return {}
    return out


def model_tensors(model_parts) -> dict:
    """FQN -> parameter (and buffer) of every part, as a state dict would name them."""
    out = {}
    for part in _as_list(model_parts):
        out.update({n: p for n, p in part.named_parameters()})
        out.update({n: b for n, b in part.named_buffers()})
    return out


def export_safetensors(path, tensors: dict, model_parts, dims=None, metadata=None) -> None:
    """Write full weights (e.g. `ema.state_dict()`) to one safetensors file from rank 0; all ranks call it."""
    from safetensors.torch import save_file

    out = gather_full(tensors, model_parts, dims)
    if out:
        save_file({k: v.clone() for k, v in out.items()}, str(path), metadata=metadata)
    if dist.is_initialized():
        dist.barrier()
