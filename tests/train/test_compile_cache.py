"""`train.compile_cache`: a restart of the same model finds its compiled blocks (inductor's FX graph and
AOTAutograd caches hit), a changed model, torch or device gets a folder of its own, and nothing
compiled lands outside the folder (torch's default /tmp/torchinductor_USER and ~ stay empty)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.train import compile_cache as cc
from tests.subprocess_env import subprocess_env

MODEL = {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10, "depth": 1, "hidden_size": 32,
         "num_heads": 2}


def _run(tmp_path, *args):
    env = subprocess_env(TMPDIR=str(tmp_path / "tmp"), HOME=str(tmp_path / "home"),
                         # Scalar kernels compile in about half the time; what is cached is the same.
                         TORCHINDUCTOR_VEC_ISA_OK="0")
    for name in cc.CACHE_VARIABLES + ("XDG_CACHE_HOME",):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "tests.train._compile_worker", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _nothing_outside(tmp_path):
    # Torch makes its default folder (empty) when it is imported; no file of the runs is outside the cache.
    assert not [p for p in (tmp_path / "tmp").rglob("*") if not p.is_dir()]
    assert not list((tmp_path / "home").rglob("*"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(the test folder, a cold compiled run's counters, its restart's counters): the restart then compiles a wider
    model's step into the first model's folder (its counters under "other")."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("inductor needs a C compiler on CPU")
    tmp_path = tmp_path_factory.mktemp("compile_cache")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "home").mkdir()
    run = tmp_path / "run"
    # The restart: resumed at step 1, its step 2 compiles the blocks' forward and backward again, from the cache.
    return tmp_path, _run(tmp_path, run), _run(tmp_path, run, "--steps", 2, "--then-wider")


def test_a_restart_hits_the_compile_cache_in_the_run_folder(compiled):
    tmp_path, first, again = compiled
    folder = Path(first["folder"])
    assert folder.parent == tmp_path / "run" / "compile_cache" and (folder / "key.json").is_file()
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 2 and "fxgraph_cache_hit" not in first["inductor"]
    assert any(p.suffix == ".so" for p in folder.rglob("*"))  # the compiled kernels are in the run's folder
    assert again["folder"] == first["folder"]
    assert again["inductor"].get("fxgraph_cache_hit", 0) >= 2 and "fxgraph_cache_miss" not in again["inductor"]
    assert again["aot_autograd"].get("autograd_cache_hit", 0) >= 1
    _nothing_outside(tmp_path)


def test_a_changed_model_never_hits_another_models_entries(compiled):
    """Our folders keep models apart (test below); inside one folder inductor's own keys do too: a wider
    model's step, forced into the folder where the first model's restart just hit every entry, misses them all."""
    tmp_path, first, again = compiled
    other = again["other"]
    assert other["folder"] != first["folder"]  # its own folder, left for the first model's
    assert other["inductor"].get("fxgraph_cache_miss", 0) >= 2 and "fxgraph_cache_hit" not in other["inductor"]
    _nothing_outside(tmp_path)


def test_the_folder_changes_with_the_model_torch_and_device(monkeypatch):
    base = cc.cache_folder("/c", MODEL, "cpu")
    assert base == cc.cache_folder("/c", dict(reversed(MODEL.items())), "cpu")  # key order is no change
    assert base.parent == Path("/c") and base.name.startswith("DiT-S-2-")
    # Weights are no part of a graph: a fine-tune of the model shares its folder.
    assert base == cc.cache_folder("/c", {**MODEL, "weights_path": "old/run"}, "cpu")
    others = {cc.cache_folder("/c", {**MODEL, "hidden_size": 64}, "cpu"),
              cc.cache_folder("/c", {**MODEL, "depth": 2}, "cpu")}
    monkeypatch.setattr(cc, "cpu_model_name", lambda: "another CPU")
    others.add(cc.cache_folder("/c", MODEL, "cpu"))
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    others.add(cc.cache_folder("/c", MODEL, "cpu"))
    assert base not in others and len(others) == 4


def test_auto_off_and_a_path(tmp_path, monkeypatch):
    assert cc.resolve_root("auto", tmp_path / "run") == tmp_path / "run" / "compile_cache"
    assert cc.resolve_root("off", tmp_path / "run") is None
    assert cc.resolve_root(str(tmp_path / "shared"), "ignored") == tmp_path / "shared"
    for name in cc.CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    cfg = build_config({"output_dir": str(tmp_path / "run"), "model": MODEL, "train": {"compile_cache": "off"}})
    assert cc.use_compile_cache(cfg, "cpu") is None and not (tmp_path / "run").exists()
    assert not any(os.environ.get(name) for name in cc.CACHE_VARIABLES)
    (tmp_path / "file").write_text("not a folder")
    cfg.train.compile_cache = str(tmp_path / "file" / "cache")
    with pytest.raises(ConfigError, match=r"train.compile_cache: cannot create .*file/cache/DiT-S-2-\w+: "):
        cc.use_compile_cache(cfg, "cpu")
    with pytest.raises(ConfigError, match="train.compile_cache is empty"):
        build_config({"output_dir": str(tmp_path), "train": {"compile_cache": " "}})


def test_archiving_an_earlier_run_leaves_the_compile_cache(tmp_path):
    from dit_trainer.train.resume import prepare_fresh_start

    run = tmp_path / "run"
    (run / "compile_cache" / "DiT-S-2-0123").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    cfg = build_config({"output_dir": str(run), "model": MODEL, "checkpoint": {"resume": False, "on_existing": "archive"}})
    prepare_fresh_start(cfg, is_main=True)
    archived = [p for p in tmp_path.iterdir() if p.name.startswith("run.archived-")]
    assert len(archived) == 1 and (archived[0] / "metrics.jsonl").is_file()
    assert (run / "compile_cache" / "DiT-S-2-0123").is_dir() and not (archived[0] / "compile_cache").exists()
