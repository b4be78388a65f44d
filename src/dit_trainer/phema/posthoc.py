"""Post-hoc EMA: EMA weights of any width sigma_rel, rebuilt after training from a run's snapshots.

Each snapshot at step t_i stores one profile per tracked width; a target (sigma_rel, T) is the
least-squares combination of the stored profiles with t_i <= T (`profile.solve_coefficients`), applied
tensor by tensor to their weights. The result is written as a checkpoint folder (`ema.safetensors` in
fp32, the run's `config.yaml`, `phema.json` saying how it was made, `manifest.json`), which `dit sample`,
`sample-ddp`, `eval` and `convert` read like any checkpoint.
"""

import contextlib
import json
import shutil
from pathlib import Path

import torch

from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.phema.paths import FROZEN, list_snapshots, phema_folder, phema_root, snapshot_path
from dit_trainer.phema.profile import MAX_STD, fit_error, solve_coefficients, std_to_gamma
from dit_trainer.phema.snapshots import Snapshot, damaged


def check_stds(stds, flag: str = "--std") -> list:
    """The widths as floats, each with a power-function profile; a one-line ConfigError naming `flag` else."""
    out = []
    for std in stds:
        try:
            std_to_gamma(std)
        except (TypeError, ValueError):
            raise ConfigError(f"{flag} {std!r} has no power-function EMA: sigma_rel must be in (0, {MAX_STD:.4f}) "
                              "(exponent > 0), e.g. 0.05 or 0.10") from None
        if float(std) not in out:
            out.append(float(std))
    if not out:
        raise ConfigError(f"{flag} names no width; pass one or more, e.g. {flag} 0.05 0.10")
    return out


def reconstruct(run_dir, stds, at_step=None, out=None) -> list:
    """Write the EMA of each width in `stds` at snapshot step `at_step` (default: the newest snapshot) as a
    checkpoint folder, `phema_folder(run_dir, std, step)` or the same name under `out`; returns the folders."""
    run = Path(run_dir)
    if not run.is_dir():
        raise CheckpointError(f"{run} is not a folder; pass a run's output_dir (it holds phema/snapshot-*.safetensors)")
    stds = check_stds(stds)
    found = list_snapshots(run)
    if not found:
        raise CheckpointError(f"{phema_root(run)} holds no post-hoc EMA snapshots (snapshot-XXXXXXXX.safetensors); "
                              "train with train.phema_stds set (e.g. --train.phema_stds 0.05,0.10) to record them")
    steps = [s for s, _ in found]
    target = steps[-1] if at_step is None else int(at_step)
    if target not in steps:
        raise ConfigError(f"--at {at_step}: {phema_root(run)} holds no snapshot of step {target}; pass one of its "
                          f"steps ({_listed(steps)}) or leave --at out for the newest")
    config = run / "config.yaml"
    if not config.is_file():
        raise CheckpointError(f"{config} is missing; a reconstruction carries the run's config, so pass the run's "
                              "own output_dir")
    snapshots = [Snapshot(p, s) for s, p in found if s <= target]
    weights, fits, coefficients = combine(snapshots, stds, target)
    folders = []
    for j, std in enumerate(stds):
        name = phema_folder(run, std, target).name
        record = {"std": std, "gamma": std_to_gamma(std), "step": target, "fit_error": fits[j],
                  "snapshots": [{"file": s.path.name, "std": w, "coefficient": float(c), **_fingerprint(s.path)}
                                for (s, w), c in zip(_stored(snapshots), coefficients[:, j])]}
        folders.append(_write_folder(Path(out) / name if out is not None else run / "phema" / name,
                                     weights[j], config, record))
    return folders


def _fingerprint(path) -> dict:
    """What tells a snapshot file from another of the same name (a run restarted, resumed from an earlier step)."""
    st = Path(path).stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def up_to_date(folder, run_dir) -> bool:
    """Whether reconstruction `folder` was made from the snapshots `run_dir` holds now up to its step (records of
    an older dit ema, without fingerprints, are compared by file name)."""
    try:
        record = json.loads((Path(folder) / "phema.json").read_text())
        used = {entry["file"]: entry for entry in record["snapshots"]}
        step = int(record["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    now = {path.name: path for s, path in list_snapshots(run_dir) if s <= step}
    if set(used) != set(now):
        return False
    return all("mtime_ns" not in entry or _fingerprint(now[name]) == {k: entry.get(k) for k in ("bytes", "mtime_ns")}
               for name, entry in used.items())


def rebuildable(run_dir, step: int) -> bool:
    """Whether `run_dir` holds the snapshot of `step` that a reconstruction at `step` needs."""
    return snapshot_path(run_dir, step).is_file()


def _listed(steps) -> str:
    shown = [str(s) for s in steps]
    return ", ".join(shown if len(shown) <= 8 else shown[:3] + ["..."] + shown[-3:])


def _stored(snapshots) -> list:
    """(snapshot, width) of every stored profile, in the order of the coefficients."""
    return [(s, std) for s in snapshots for std in s.stds]


def combine(snapshots, stds, target: int):
    """([{FQN: fp32 tensor}] per width, fit errors, coefficient matrix) of the targets (std, `target`)."""
    stored = _stored(snapshots)
    profiles = [(s.step, std_to_gamma(w)) for s, w in stored]
    goals = [(target, std_to_gamma(std)) for std in stds]
    try:
        x = solve_coefficients(profiles, goals)
    except ValueError as err:
        raise CheckpointError(f"{snapshots[0].path.parent}: the snapshots up to step {target} cannot be combined "
                              f"({err}); move the repeated or damaged ones aside") from None
    fits = [fit_error(profiles, goal, x[:, j]) for j, goal in enumerate(goals)]
    newest = snapshots[-1]
    trained = _trained_names(snapshots)
    out = [{} for _ in stds]
    with contextlib.ExitStack() as stack:
        from safetensors import safe_open

        handles = [stack.enter_context(safe_open(str(s.path), framework="pt")) for s in snapshots]
        index = {id(s): h for s, h in zip(snapshots, handles)}
        for name in trained:
            total = None
            for row, (s, w) in enumerate(stored):
                # float64 sums: dozens of terms with coefficients of both signs lose no bits of fp32 weights.
                value = s.tensor(index[id(s)], f"{s.labels[s.stds.index(w)]}/{name}").double()
                terms = torch.as_tensor(x[row]).reshape((-1,) + (1,) * value.dim()) * value
                total = terms if total is None else total + terms
            if not bool(torch.isfinite(total.sum())):
                # A NaN or inf in any term reaches the sum (times 0 too); checked once here, not per term
                # (isfinite of every fp16 term costs more than the sum), then the file holding it is named.
                for s, w in stored:
                    s.tensor(index[id(s)], f"{s.labels[s.stds.index(w)]}/{name}", check_finite=True)
                raise CheckpointError(f"the weighted sum of the snapshots' {name} overflows in {snapshots[0].path.parent}; "
                                      "rebuild widths closer to the tracked ones")
            for j in range(len(stds)):
                out[j][name] = total[j].float()
        # Frozen parameters never changed: taken as stored (in their own dtype), not summed with rounding.
        for name in (n.partition("/")[2] for n in newest.names if n.startswith(FROZEN + "/")):
            value = newest.tensor(index[id(newest)], f"{FROZEN}/{name}", check_finite=True)
            for j in range(len(stds)):
                out[j][name] = value.clone()
    return out, fits, x


def _trained_names(snapshots) -> list:
    """The FQNs every profile of every snapshot holds; a snapshot whose names differ is damaged or of another model."""
    first = None
    for s in snapshots:
        for label in s.labels:
            names = sorted(n.partition("/")[2] for n in s.names if n.startswith(label + "/"))
            if first is None:
                first = (s, names)
            elif names != first[1]:
                raise damaged(s.path, f"profile {label} holds other tensors than {first[0].path.name}")
    if not first[1]:
        raise damaged(first[0].path, "it holds no weights")
    return first[1]


def _write_folder(folder: Path, weights: dict, config: Path, record: dict) -> Path:
    """A checkpoint folder written beside `folder` under a temporary name and renamed (replacing an older one)."""
    from safetensors.torch import save_file

    from dit_trainer.checkpoint.files import write_manifest
    from dit_trainer.fs import staged_folder

    from dit_trainer.fs import write_error_text

    try:
        with staged_folder(folder, replace=True, error=CheckpointError) as tmp:
            save_file(weights, str(tmp / "ema.safetensors"))
            shutil.copyfile(config, tmp / "config.yaml")
            (tmp / "phema.json").write_text(json.dumps(record, indent=1))
            write_manifest(tmp)
    except OSError as err:  # beyond a full disk (staged_folder's own): a file where a folder goes, no such parent, ...
        raise CheckpointError(f"{write_error_text(folder, err)}; write into a folder that can be created") from None
    return folder

