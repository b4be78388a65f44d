"""`dit plan` and `parallel.layout auto`: the ranking, what it keeps, and how it is applied."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dit_trainer.config import build_config, save_config
from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.plan import apply_auto_layout, load_hardware, make_request, plan_layouts
from dit_trainer.plan.hardware import parse_memory
from dit_trainer.plan.layouts import Layout
from dit_trainer.plan.memory import Numerics, rank_memory
from dit_trainer.plan.search import GIB

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = {"name": "DiT-S/2", "depth": 4, "hidden_size": 64, "num_heads": 4, "input_size": 8, "num_classes": 10}


def _cfg(**train):
    return build_config({"output_dir": "unused", "model": dict(TINY),
                             "train": {"global_batch_size": 8, "device": "cpu", **train}})


def test_dit_plan_prices_large_dit_7b_on_16_gpus_in_seconds_and_its_top_layout_fits():
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dit_trainer", "plan", "--model", "LargeDiT-7B/2", "--gpus", "16",
                           "--gpus-per-node", "8", "--gpu-memory", "80GiB", "--hardware", "h100"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert seconds < 30
    first = next(line for line in proc.stdout.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[-1] == "yes" and float(cells[4]) <= 78.0  # peak GiB within 80 less the reserve
    assert "beats #2" in proc.stdout and "do not fit" in proc.stdout


def test_the_top_plan_fits_and_no_faster_layout_does():
    cfg = build_config(None, ["--model.name", "LargeDiT-7B/2"])
    plans = plan_layouts(make_request(cfg, 16, 8, "h100", 80))
    best = plans[0]
    assert best.fits and best.peak.total <= (80 - 2) * GIB
    assert all(p.time.total >= best.time.total for p in plans if p.fits)
    # Every layout holding the whole 7B model's float32 state on one rank needs over 80 GiB.
    whole = [p for p in plans if p.layout.dp_shard == 1 and p.layout.tp == 1 and p.layout.pp == 1]
    assert whole and not any(p.fits for p in whole)


def test_sharding_pipelining_and_checkpointing_lower_the_memory_they_should():
    cfg = build_config(None, ["--model.name", "DiT-XL/2"])
    costs = get_spec("DiT-XL/2").costs_fn(cfg)
    num = Numerics(2, fused_attention=True)

    def peak(layout, batch=256):
        return max(r.total for r in rank_memory(costs, layout, batch, num))

    single = peak(Layout(dp_replicate=8))
    assert peak(Layout(dp_shard=8)) < single
    assert peak(Layout(dp_replicate=8, ac="full")) < peak(Layout(dp_replicate=8, ac="selective")) < single
    gpipe = Layout(dp_shard=4, pp=2, schedule="gpipe", microbatches=8)
    one_f_one_b = Layout(dp_shard=4, pp=2, schedule="1f1b", microbatches=8)
    assert peak(one_f_one_b) < peak(gpipe)
    assert peak(Layout(dp_replicate=8, compile=True, budget=0.5)) < peak(Layout(dp_replicate=8, compile=True))


def test_post_hoc_ema_profiles_raise_every_plans_peak_by_their_copies_and_its_step_by_their_updates():
    cfg = build_config(None, ["--model.name", "DiT-XL/2"])
    tracked = build_config(None, ["--model.name", "DiT-XL/2", "--train.phema_stds", "[0.05, 0.1]"])
    plain = {p.layout: p for p in plan_layouts(make_request(cfg, 8, 8, "h100", 80))}
    both = {p.layout: p for p in plan_layouts(make_request(tracked, 8, 8, "h100", 80))}
    assert plain.keys() == both.keys()
    bandwidth = load_hardware("h100").memory_bandwidth_gbs * 1e9
    for layout, plan in plain.items():
        peak, tracked_peak = plan.peak, both[layout].peak
        assert tracked_peak.phema == 2 * peak.ema > 0 and peak.phema == 0
        assert tracked_peak.total == pytest.approx(peak.total + 2 * peak.ema)
        # Each profile's update on a GPU is one lerp over this rank's float32 trained weights (12 bytes a
        # weight, parallel/ema.py); the EMA's bytes also hold the frozen position table (0.1% of DiT-XL/2).
        extra = both[layout].time.optimizer - plan.time.optimizer
        if layout.pp == 1:  # the peak rank is the timed one
            assert extra == pytest.approx(2 * (peak.ema / 4) * 12 / bandwidth, rel=2e-3)
        assert extra > 0 and both[layout].time.total == pytest.approx(plan.time.total + extra)


def test_pinned_checkpointing_and_compile_are_kept():
    cfg = build_config(None, ["--model.name", "DiT-B/2", "--train.activation_checkpointing", "full",
                             "--train.compile", "false"])
    plans = plan_layouts(make_request(cfg, 4, 4, "a100"))
    assert {p.layout.ac for p in plans} == {"full"} and not any(p.layout.compile for p in plans)


def test_token_routing_is_priced_faster_and_never_pipelined():
    def plans(*flags):
        return plan_layouts(make_request(build_config(None, ["--model.name", "DiT-XL/2", *flags]), 8, 8, "h100", 80))

    full, routed = plans(), plans("--train.routing_keep", "0.5")
    assert any(p.layout.pp > 1 for p in full) and not any(p.layout.pp > 1 for p in routed)
    same = {p.layout: p.time.compute for p in full}
    assert all(p.time.compute < 0.75 * same[p.layout] for p in routed)  # 24 of 28 blocks on half the tokens


def test_apply_auto_layout_writes_the_top_plan_and_the_config_keeps_it(tmp_path):
    cfg = _cfg()
    cfg.parallel.layout = "auto"
    plan = apply_auto_layout(cfg, world_size=4, hardware="cpu", gpus_per_node=4, gpu_memory_gib=64)
    par = cfg.parallel
    assert plan.fits and par.layout == "manual"
    assert (par.dp_replicate, par.dp_shard, par.tp, par.pp) == (plan.layout.dp_replicate, plan.layout.dp_shard,
                                                                 plan.layout.tp, plan.layout.pp)
    assert par.dp_replicate * par.dp_shard * par.tp * par.pp == 4
    assert cfg.train.activation_checkpointing == plan.layout.ac
    # train.compile auto: a model under 10M parameters never repays the compile.
    assert cfg.train.compile == "false" and not plan.layout.compile
    save_config(cfg, tmp_path / "config.yaml")
    again = build_config(tmp_path / "config.yaml")
    assert (again.parallel.dp_shard, again.parallel.tp, again.parallel.pp) == (par.dp_shard, par.tp, par.pp)


def test_auto_layout_says_in_one_line_when_nothing_fits():
    with pytest.raises(ConfigError, match="no layout .* fits") as err:
        apply_auto_layout(_cfg(), world_size=2, hardware="cpu", gpus_per_node=2, gpu_memory_gib=0.001)
    assert "\n" not in str(err.value)


def test_trainer_applies_parallel_layout_auto_before_the_mesh(tmp_path):
    cfg = build_config({"output_dir": str(tmp_path), "model": dict(TINY),
                            "parallel": {"layout": "auto"}, "logging": {"tensorboard": False, "progress": False},
                            "train": {"global_batch_size": 4, "device": "cpu", "max_steps": 1, "compile": "false"}})
    from dit_trainer.train import DiTTrainer

    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 8, 8, generator=g), torch.tensor(i % 10)) for i in range(8)]
    trainer = DiTTrainer(cfg, dataset=data)
    assert trainer.cfg.parallel.layout == "manual" and trainer.dims.world_size == 1
    trainer.train()
    assert "layout: manual" in (tmp_path / "config.yaml").read_text()


def test_bad_inputs_are_one_line_errors_naming_the_flag():
    with pytest.raises(ConfigError, match="parallel.layout"):
        build_config({"parallel": {"layout": "fastest"}})
    with pytest.raises(ConfigError, match="--hardware"):
        load_hardware("tpu-v9")
    with pytest.raises(ConfigError, match="--gpu-memory"):
        parse_memory("lots")
    with pytest.raises(ConfigError, match="--gpus-per-node"):
        make_request(_cfg(), 12, 8)
    assert parse_memory("80GiB") == 80 and parse_memory("96000MiB") == pytest.approx(93.75)
    assert parse_memory("80GB") == pytest.approx(80e9 / 2**30)
