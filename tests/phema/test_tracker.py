"""PowerEMA follows the power-function profile it names, and a reconstruction from its snapshots gives
back a tracked profile (bit-near in fp32, the fp16-rounded value in fp16) or a width between the tracked ones."""

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from dit_trainer.models import DiT
from dit_trainer.phema import PowerEMA, list_snapshots, reconstruct
from dit_trainer.phema.profile import std_to_gamma, step_weights


def _tiny():
    torch.manual_seed(0)
    return DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=4)


@torch.no_grad()
def _set_weights(model, step, base):
    """Weights a + b * step for every trained parameter (b random per element), so every average is known."""
    for name, p in model.named_parameters():
        if p.requires_grad:
            a, b = base[name]
            p.copy_(a + b * step)


def _bases(model):
    g = torch.Generator().manual_seed(1)
    return {n: (torch.randn(p.shape, generator=g), torch.randn(p.shape, generator=g) * 0.01)
            for n, p in model.named_parameters() if p.requires_grad}


def _run(tmp_path, stds=(0.05, 0.10), steps=60, every=10, dtype="fp32"):
    """A PowerEMA over weights a + b * step, snapshots every `every` steps in tmp_path/run; returns
    (model, tracker, bases, {step: copies of the profiles at each snapshot})."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text("model:\n  name: DiT-S/2\n")
    model = _tiny()
    bases = _bases(model)
    tracker = PowerEMA(model, stds, output_dir=run, every=every, dtype=dtype)
    kept = {}
    for step in range(1, steps + 1):
        _set_weights(model, step, bases)
        tracker.update(step)
        if tracker.snapshot_due(step, steps):
            tracker.write_snapshot(step)
            kept[step] = {label: {n: t.clone() for n, t in sd.items()} for label, sd in tracker.state_dict().items()}
    return model, tracker, bases, kept


def test_constant_weights_stay_constant():
    model = _tiny()
    tracker = PowerEMA(model, [0.05, 0.2])
    for step in range(1, 40):
        tracker.update(step)
    for label, profile in tracker.state_dict().items():
        for name, p in model.named_parameters():
            torch.testing.assert_close(profile[name], p.detach(), rtol=1e-6, atol=1e-7, msg=f"{label} {name}")


def test_tracked_average_is_the_power_function_of_the_steps(tmp_path):
    model = _tiny()
    bases = _bases(model)
    tracker = PowerEMA(model, [0.05, 0.15])
    steps = 40
    for step in range(1, steps + 1):
        _set_weights(model, step, bases)
        tracker.update(step)
    i = torch.arange(1, steps + 1, dtype=torch.float64)
    for std, (label, profile) in zip(tracker.stds, tracker.state_dict().items()):
        w = torch.from_numpy(step_weights(steps, std_to_gamma(std)))
        mean_step = float((w * i).sum())  # the profile's mean step; the weights are linear in the step
        for name, (a, b) in bases.items():
            want = a.double() + b.double() * mean_step
            torch.testing.assert_close(profile[name].double(), want, rtol=1e-5, atol=1e-6, msg=f"{label} {name}")
        assert torch.equal(profile["pos_embed"], model.pos_embed)  # frozen: copied, not averaged


def test_a_skipped_step_leaves_every_profile():
    model = _tiny()
    bases = _bases(model)
    tracker = PowerEMA(model, [0.05, 0.10])
    for step in (1, 2):
        _set_weights(model, step, bases)
        tracker.update(step)
    before = {label: {n: t.clone() for n, t in sd.items()} for label, sd in tracker.state_dict().items()}
    _set_weights(model, 3, bases)
    tracker.update(3, skip=torch.tensor(1.0))
    for label, sd in tracker.state_dict().items():
        for name, t in sd.items():
            if name != "pos_embed":
                assert torch.equal(t, before[label][name]), (label, name)
    tracker.update(3, skip=torch.tensor(0.0))
    assert not torch.equal(tracker.state_dict()["std0.050"]["x_embedder.proj.weight"],
                           before["std0.050"]["x_embedder.proj.weight"])


@pytest.mark.parametrize("at", [None, 30])
def test_fp32_reconstruction_at_a_tracked_width_is_the_tracked_profile(tmp_path, at):
    model, tracker, _, kept = _run(tmp_path)
    step = at or max(kept)
    assert [s for s, _ in list_snapshots(tmp_path / "run")] == [10, 20, 30, 40, 50, 60]
    folders = reconstruct(tmp_path / "run", [0.10, 0.05], at_step=at)
    assert [f.name for f in folders] == [f"std0.100-step{step:08d}", f"std0.050-step{step:08d}"]
    for folder, label in zip(folders, ("std0.100", "std0.050")):
        got = load_file(str(folder / "ema.safetensors"))
        want = kept[step][label]
        assert sorted(got) == sorted(want)
        for name, value in want.items():
            assert got[name].dtype == torch.float32
            assert (got[name] - value).abs().max() < 1e-6, name
        assert torch.equal(got["pos_embed"], model.pos_embed)


def test_fp16_snapshots_reconstruct_the_rounded_profile_and_keep_frozen_parameters_exact(tmp_path):
    model, tracker, _, kept = _run(tmp_path, dtype="fp16")
    with safe_open(str(tmp_path / "run" / "phema" / "snapshot-00000060.safetensors"), "pt") as f:
        assert f.get_tensor("std0.050/x_embedder.proj.weight").dtype == torch.float16
        assert f.get_tensor("frozen/pos_embed").dtype == torch.float32
        assert f.metadata()["step"] == "60" and f.metadata()["dtype"] == "fp16"
    got = load_file(str(reconstruct(tmp_path / "run", [0.05])[0] / "ema.safetensors"))
    rounded_away = 0.0
    for name, value in kept[60]["std0.050"].items():
        if name == "pos_embed":
            assert torch.equal(got[name], model.pos_embed)  # never rounded to fp16
            continue
        assert (got[name] - value.half().float()).abs().max() < 1e-6, name
        rounded_away = max(rounded_away, float((got[name] - value).abs().max()))
    assert rounded_away > 1e-6  # the test would not see fp16 otherwise


def test_a_width_between_the_tracked_ones_lies_between_them(tmp_path):
    _, tracker, bases, kept = _run(tmp_path, steps=100, every=10)
    got = load_file(str(reconstruct(tmp_path / "run", [0.075])[0] / "ema.safetensors"))
    narrow, wide = kept[100]["std0.050"], kept[100]["std0.100"]
    i = np.arange(1, 101)
    exact_mean_step = float((step_weights(100, std_to_gamma(0.075)) * i).sum())
    for name, (a, b) in bases.items():
        lo, hi = torch.minimum(narrow[name], wide[name]), torch.maximum(narrow[name], wide[name])
        moving = b.abs() > 1e-3  # where the weights change enough for the profiles to differ in fp32
        assert bool(((got[name] >= lo - 1e-6) & (got[name] <= hi + 1e-6))[moving].all()), name
        # Closer to the 0.075 profile's own average than either neighbour is.
        want = a + b * exact_mean_step
        err = (got[name] - want)[moving].abs().max()
        assert err < (narrow[name] - want)[moving].abs().max() / 3 and err < (wide[name] - want)[moving].abs().max() / 3
