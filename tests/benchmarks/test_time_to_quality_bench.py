"""benchmarks/time_to_quality.py: its arithmetic, the probe's interleaving (a recipe added later too), reuse
only under the same key, equal network evaluations per sample, and every recipe a config `dit train` accepts."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIBLINGS = ("_common", "time_to_quality_keys", "time_to_quality_probe", "time_to_quality_recipes")


@pytest.fixture(scope="module")
def ttq():
    # The script imports its sibling modules by their bare names, as `python benchmarks/...` runs it: the
    # benchmarks folder is on the path while it loads, and the bare names are gone again after (the tests'
    # own helpers are imported as the tests package, tests.parallel._common, so the names cannot meet).
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("time_to_quality", ROOT / "benchmarks" / "time_to_quality.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        for name in SIBLINGS:
            sys.modules.pop(name, None)


def _args(ttq, *flags):
    return ttq.parse_args(["--out", "unused", *flags])[0]


def test_time_to_reach_interpolates_between_measured_points(ttq):
    points = [(10.0, 40.0), (20.0, 20.0), (30.0, 10.0)]
    assert ttq.time_to_reach(points, 40.0) == 10.0
    assert ttq.time_to_reach(points, 30.0) == pytest.approx(15.0)
    assert ttq.time_to_reach(points, 15.0) == pytest.approx(25.0)
    assert ttq.time_to_reach(points, 5.0) is None


class FakeTrain:
    """Stands in for train(): records the order of the runs, returns given windows, can fail at a call."""

    def __init__(self, windows, fail_at=None):
        self.windows, self.fail_at, self.order = windows, fail_at, []

    def __call__(self, parent, recipe, task, seed, steps, save_every, log_steps, fresh=False):
        assert fresh, "a probe run is never reused"
        self.order.append(recipe)
        if len(self.order) == self.fail_at:
            raise KeyboardInterrupt
        return parent / recipe, "digest", list(enumerate(self.windows[recipe]))


def test_probe_interleaves_rounds_and_takes_the_median_without_warm_up(ttq, monkeypatch, tmp_path):
    fake = FakeTrain({"dit": [9.0, 1.0, 2.0, 3.0], "sit": [9.0, 5.0, 5.0, 7.0]})
    monkeypatch.setattr(ttq, "train", fake)
    got = ttq.probe_speeds(tmp_path, ["dit", "sit"], ttq.TASKS["digits16"], seed=0, steps=40, log_steps=10)
    assert {r: p["s_per_step"] for r, p in got.items()} == {"dit": 2.0, "sit": 5.0}
    assert fake.order == ["dit", "sit", "sit", "dit"]
    # Asked again: nothing is probed, the speeds are the recorded ones.
    assert ttq.probe_speeds(tmp_path, ["dit", "sit"], ttq.TASKS["digits16"], seed=0, steps=40, log_steps=10) == got
    assert len(fake.order) == 4


def test_a_recipe_added_later_is_probed_again_beside_the_baseline(ttq, monkeypatch, tmp_path):
    task = ttq.TASKS["digits16"]
    monkeypatch.setattr(ttq, "train", FakeTrain({"dit": [9.0, 2.0, 2.0], "sit": [9.0, 3.0, 3.0]}))
    ttq.probe_speeds(tmp_path, ["dit", "sit"], task, seed=0, steps=40, log_steps=10)
    # A later sitting on a machine twice as slow: the baseline is probed again in the same rounds.
    later = FakeTrain({"dit": [9.0, 4.0, 4.0], "sit+ema": [9.0, 5.0, 5.0]})
    monkeypatch.setattr(ttq, "train", later)
    got = ttq.probe_speeds(tmp_path, ["dit", "sit", "sit+ema"], task, seed=0, steps=40, log_steps=10)
    assert later.order == ["dit", "sit+ema", "sit+ema", "dit"]
    assert got["sit+ema"]["s_per_step"] == pytest.approx(5.0 / 4.0 * 2.0)  # its ratio to the baseline beside it
    assert (got["dit"]["s_per_step"], got["sit"]["s_per_step"]) == (2.0, 3.0)  # the budget stays the first probe's
    assert (got["sit"]["group"], got["sit+ema"]["group"], got["sit+ema"]["probed_s_per_step"]) == (0, 1, 5.0)


def test_an_interrupted_probe_is_probed_again_whole(ttq, monkeypatch, tmp_path):
    task, windows = ttq.TASKS["digits16"], {"dit": [9.0, 2.0, 2.0], "sit": [9.0, 3.0, 3.0]}
    monkeypatch.setattr(ttq, "train", FakeTrain(windows, fail_at=3))
    with pytest.raises(KeyboardInterrupt):
        ttq.probe_speeds(tmp_path, ["dit", "sit"], task, seed=0, steps=40, log_steps=10)
    again = FakeTrain(windows)
    monkeypatch.setattr(ttq, "train", again)
    ttq.probe_speeds(tmp_path, ["dit", "sit"], task, seed=0, steps=40, log_steps=10)
    assert again.order == ["dit", "sit", "sit", "dit"]


def test_a_recipe_whose_overrides_changed_is_probed_again(ttq):
    from time_to_quality_probe import still_to_probe

    group = {"recipes": {"dit": {}, "sit": {"objective": "transport"}}, "s_per_step": {"dit": 1.0, "sit": 1.0}}
    assert still_to_probe([group], {"dit": {}, "sit": {"objective": "transport"}}) == []
    assert still_to_probe([group], {"dit": {}, "sit": {"objective": "transport", "train.ema_decay": 0.9}}) == ["dit", "sit"]
    assert still_to_probe([group], {"dit": {"train.seed": 1}, "sit": {"objective": "transport"}}) == ["dit", "sit"]


def _fake_dit(calls, extra=1.0):
    def dit(args, log):
        args = list(map(str, args))
        calls.append(args)
        if args[0] == "train":
            import yaml

            config = yaml.safe_load(Path(args[2]).read_text())
            out, steps = Path(config["output_dir"]), config["train"]["max_steps"]
            (out / "checkpoints" / f"step-{steps:08d}").mkdir(parents=True)
            (out / "metrics.jsonl").write_text(json.dumps({"step": steps, "s_per_step": 0.5}) + "\n")
        elif args[0] == "sample-ddp":
            import numpy as np

            from time_to_quality_recipes import ODE_STAGES

            flag = dict(zip(args[1::2], args[2::2]))
            steps = int(flag["--steps"])
            per_branch = steps if flag["--sampler"] == "ddim" else (steps - 1) * ODE_STAGES[flag["--ode-method"]]
            nfe = per_branch * (1 if float(flag["--cfg-scale"]) == 1 else 2) * extra  # as sample-ddp counts
            np.savez(args[args.index("--npz") + 1], arr_0=np.zeros((1, 8, 8, 3), np.uint8), nfe=np.float64(nfe))
        elif args[0] == "eval":
            Path(args[args.index("--json") + 1]).write_text(json.dumps({"fid": 12.5}))
    return dit


def test_a_run_is_reused_only_under_the_same_key(ttq, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(ttq, "dit", _fake_dit(calls))
    task = ttq.TASKS["digits16"]
    first = ttq.train(tmp_path, "sit+routing", task, 0, 20, 10, 10)
    assert first[2] == [(20, 0.5)] and (first[0] / "key.json").is_file()
    assert ttq.train(tmp_path, "sit+routing", task, 0, 20, 10, 10) == first and len(calls) == 1
    others = [("sit+routing", task, 1, 20, 10, 10), ("sit+routing", task, 0, 30, 10, 10),
              ("sit+routing", task, 0, 20, 5, 10), ("sit+routing", ttq.TASKS["latent256"], 0, 20, 10, 10),
              ("sit", task, 0, 20, 10, 10)]
    folders = {ttq.train(tmp_path, *other)[0] for other in others}
    assert len(calls) == 1 + len(others) and len(folders | {first[0]}) == 1 + len(others)
    assert "--train.routing_start" in calls[0] and "--train.routing_start" not in calls[-1]
    # A key that does not match what the folder's name says: refused in one line, never reused.
    key = json.loads((first[0] / "key.json").read_text())
    key["config"]["train"]["seed"] = 7
    (first[0] / "key.json").write_text(json.dumps(key))
    with pytest.raises(SystemExit) as err:
        ttq.train(tmp_path, "sit+routing", task, 0, 20, 10, 10)
    assert "config.train.seed" in str(err.value) and "\n" not in str(err.value)


def test_a_score_is_reused_only_under_the_same_key(ttq, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(ttq, "dit", _fake_dit(calls))
    args = _args(ttq)
    assert ttq.score(tmp_path, "run1", 100, "sit", ("digits", {"ref": "digits"}), args)[0] == 12.5
    ttq.score(tmp_path, "run1", 100, "sit", ("digits", {"ref": "digits"}), args)
    assert [c[0] for c in calls] == ["sample-ddp", "eval"]
    for changed in (["--nfe", "20"], ["--cfg-scale", "4"], ["--num-samples", "500"], ["--ode-method", "euler"]):
        ttq.score(tmp_path, "run1", 100, "sit", ("digits", {"ref": "digits"}), _args(ttq, *changed))
    ttq.score(tmp_path, "run2", 100, "sit", ("digits", {"ref": "digits"}), args)
    ttq.score(tmp_path, "run1", 200, "sit", ("digits", {"ref": "digits"}), args)
    ttq.score(tmp_path, "run1", 100, "sit", ("ref.npz", {"ref": "real digits", "size": 32}), args)
    assert [c[0] for c in calls].count("sample-ddp") == 1 + 4 + 3
    assert len(list(tmp_path.glob("fid-*.key.json"))) == 1 + 4 + 3


def _count_calls(objective, flags):
    import torch

    options = dict(zip(flags[::2], flags[1::2]))
    calls = []

    def model_fn(x, t, **kw):
        calls.append(x.shape[0])
        return torch.zeros_like(x)

    extra = {"ode_method": options["--ode-method"]} if "--ode-method" in options else {}
    objective.sample(model_fn, torch.randn(2, 1, 4, 4), sampler=options["--sampler"], steps=options["--steps"],
                     **extra)
    return len(calls)


@pytest.mark.parametrize("kind,method,nfe", [("diffusion", None, 50), ("transport", "midpoint", 50),
                                             ("transport", "euler", 20), ("transport", "heun3", 12),
                                             ("transport", "rk4", 20)])
def test_the_sampler_flags_evaluate_the_network_nfe_times(ttq, kind, method, nfe):
    from time_to_quality_recipes import sampler_flags

    from dit_trainer.config import build_config
    from dit_trainer.objective import build_objective

    raw = ttq.task_config(ttq.TASKS["digits16"], 0, 10, 10, 10)
    cfg = build_config({**raw, "output_dir": "unused", "objective": kind})
    assert _count_calls(build_objective(cfg), sampler_flags(kind, nfe, method)) == nfe


def test_nfe_that_a_method_cannot_take_is_refused_in_one_line(ttq, capsys):
    for flags, needle in ((["--nfe", "25"], "not a positive multiple of midpoint's 2"),
                          (["--ode-method", "dopri5"], "not a fixed-step method"),
                          (["--recipes", "dit+logit-normal"], "recipe dit+logit-normal is now called dit+logit-normal-steps")):
        with pytest.raises(SystemExit):
            _args(ttq, *flags)
        assert needle in capsys.readouterr().err


def test_the_report_names_the_speed_up_to_the_baseline_fid_beside_the_nfe(ttq):
    base = {"seed": 1, "recipe": "dit", "s_per_step": 0.2, "budget_s": 40.0, "nfe": 50, "sampler": "ddim 50",
            "curve": [(100, 20.0, 30.0), (200, 40.0, 20.0)]}
    fast = {"seed": 1, "recipe": "sit+routing", "s_per_step": 0.1, "budget_s": 40.0, "nfe": 50, "sampler": "midpoint 25",
            "curve": [(200, 10.0, 20.0), (400, 40.0, 12.0)]}
    text = ttq.report([base, fast], steps=200)
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
             if line.startswith("| ")}
    row = dict(zip(cells["recipe"], cells["sit+routing"]))
    assert (row["sampler"], row["NFE"], row["speed-up"], row["FID at budget"]) == ("midpoint 25", "50", "4.00x", "12.00")


@pytest.mark.parametrize("task,recipe", [("digits16", "dit"), ("digits16", "sit"), ("digits16", "dit+all"),
                                         ("digits16", "sit+all"), ("latent256", "dit+routing"),
                                         ("latent256", "sit+routing")])
def test_every_recipe_key_is_a_config_key(ttq, task, recipe, tmp_path, capsys):
    import yaml

    from dit_trainer.cli import main

    config = tmp_path / "run.yaml"
    raw = ttq.task_config(ttq.TASKS[task], 0, 100, 50, 50)
    config.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "run"), **raw}))
    overrides = ttq.recipe_overrides(recipe, ttq.TASKS[task])
    args = [a for key, value in overrides.items() for a in (f"--{key}", str(value))]
    assert main(["train", "--config", str(config), *args, "--print-config"]) in (0, None)
    printed = capsys.readouterr().out
    for key, value in overrides.items():
        assert f"{key.split('.')[-1]}: {str(value).lower() if isinstance(value, bool) else value}" in printed, key


def test_latent256_has_dit_xl2s_token_count_and_treads_span(ttq):
    from dit_trainer.config import build_config
    from dit_trainer.models.routing import TokenRouting
    from dit_trainer.models.spec import get_spec

    task = ttq.TASKS["latent256"]
    raw = ttq.task_config(task, 0, 100, 50, 50)
    raw["train"].update({k.split(".")[1]: v for k, v in task.routing.items()})
    cfg = build_config({**raw, "output_dir": "unused"})
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    routing = TokenRouting.for_model(cfg.train, model)
    assert (routing.tokens, routing.kept, routing.start, routing.end, routing.depth) == (256, 128, 2, 6, 8)
    assert cfg.data.digits_size == 32 and cfg.train.global_batch_size == 64 and cfg.model.in_channels == 1


def test_the_probe_report_prices_the_budget_per_recipe(ttq):
    probed = {"dit": {"s_per_step": 2.0, "group": 0}, "sit+routing": {"s_per_step": 1.5, "group": 1}}
    text = ttq.probe_report(probed, _args(ttq, "--task", "latent256", "--steps", "1000", "--save-every", "100"))
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
             if line.startswith("| ")}
    row = dict(zip(cells["recipe"], cells["sit+routing"]))
    # 2,000 s of budget at 1.5 s/step: 1,333 steps, on the 100-step grid 1,300, 0.54 h.
    assert (row["vs dit"], row["steps in budget"], row["training h"], row["probe group"]) == ("0.75", "1300", "0.54", "1")


def test_the_reference_is_every_real_digit_at_the_tasks_size(ttq, tmp_path):
    import numpy as np

    path, key = ttq.reference(ttq.TASKS["latent256"], tmp_path)
    with np.load(path) as z:
        images = z["arr_0"]
    assert images.shape == (1797, 32, 32, 3) and images.dtype == np.uint8 and key["size"] == 32
    assert ttq.reference(ttq.TASKS["latent256"], tmp_path) == (path, key)  # written once, the same key after
    assert ttq.reference(ttq.TASKS["digits16"], tmp_path) == ("digits", {"ref": "digits"})  # the shipped one


def test_samples_recording_other_evaluations_than_asked_are_refused(ttq, monkeypatch, tmp_path):
    monkeypatch.setattr(ttq, "dit", _fake_dit([], extra=1.5))  # a guide pass per step the flags did not ask
    with pytest.raises(SystemExit) as err:
        ttq.score(tmp_path, "run1", 100, "dit", ("digits", {"ref": "digits"}), _args(ttq, "--nfe", "20"))
    assert "records 60 network evaluations per sample where the flags ask 40" in str(err.value)
    assert not list(tmp_path.glob("fid-*"))  # not scored
    monkeypatch.setattr(ttq, "dit", _fake_dit([]))
    # Unguided, one branch: 20 recorded for 20 asked.
    assert ttq.score(tmp_path, "run1", 100, "dit", ("digits", {"ref": "digits"}), _args(ttq, "--nfe", "20", "--cfg-scale", "1"))[0] == 12.5
