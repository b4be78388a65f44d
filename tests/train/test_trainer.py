"""DiTTrainer: the RFC's unit and acceptance tests (DIT-UT-03, DIT-UT-05, DIT-AL-01, DIT-AL-03) and resume."""

import json
import shutil

import pytest
import torch
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.config import Config
from dit_trainer.train import DiTTrainer
from dit_trainer.checkpoint import list_checkpoints
from dit_trainer.train.metrics import read_metrics


def test_rfc_flat_dict():
    # A short run: `train.compile auto` leaves it eager (the default length would compile DiT-S/8, a minute on CPU).
    trainer = DiTTrainer({"model_name": "DiT-S/8", "weights_path": None, "lr": 1e-4, "weight_decay": 0,
                          "num_timesteps": 1000, "input_size": 16, "num_classes": 10, "max_steps": 10})
    assert trainer.cfg.train.max_steps == 10
    assert isinstance(trainer.cfg, Config)
    assert trainer.cfg.model.name == "DiT-S/8"
    assert trainer.diffusion.num_timesteps == 1000
    group = trainer.optimizer.param_groups[0]
    assert group["lr"] == 1e-4 and group["weight_decay"] == 0
    out = trainer.train_step({"x": torch.randn(2, 4, 16, 16), "y": torch.tensor([1, 2])})
    assert isinstance(out["loss"], float) and out["loss"] > 0


def test_ut03_step_runs_and_loss_falls_on_fixed_batch(tmp_path):
    torch.manual_seed(0)
    trainer = DiTTrainer(tiny_config(tmp_path, optim={"lr": 1e-3}, model={"learn_sigma": False}))
    x, y = torch.randn(8, 4, 8, 8), torch.randint(0, 10, (8,))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    losses = [trainer.train_step((x, y))["loss"] for _ in range(50)]
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.8 * first, (first, last)


def test_ema_moves_toward_weights(tmp_path):
    trainer = DiTTrainer(tiny_config(tmp_path, train={"ema_decay": 0.5}))
    x, y = torch.randn(8, 4, 8, 8), torch.randint(0, 10, (8,))
    ema_before = {k: v.clone() for k, v in trainer.ema.state_dict().items()}
    model_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train_step((x, y))
    # adaLN-Zero: at the first step only the zero-initialised final layer receives gradient.
    key = "final_layer.linear.weight"
    expected = 0.5 * ema_before[key] + 0.5 * trainer.model.state_dict()[key]
    torch.testing.assert_close(trainer.ema.state_dict()[key], expected)
    assert not torch.equal(trainer.model.state_dict()[key], model_before[key])


def test_ut05_ten_npy_files_five_steps(tmp_path):
    data = write_npy_latents(tmp_path / "latents", n=10)
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)}, train={"max_steps": 5, "global_batch_size": 4})
    trainer = DiTTrainer(cfg)
    trainer.train()
    assert trainer.step == 5
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["loss"] > 0 for r in records)


def test_al01_hundred_steps_stable_and_recorded(tmp_path):
    data = write_npy_latents(tmp_path / "latents", n=32)
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)},
                      train={"max_steps": 100, "global_batch_size": 8}, logging={"log_steps": 10})
    DiTTrainer(cfg).train()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(10, 101, 10))
    losses = [r["loss"] for r in records]
    assert all(torch.isfinite(torch.tensor(losses)))
    # Stable: no interval average exceeds the first by much, and the end is below the start.
    assert max(losses) < 1.5 * losses[0] and losses[-1] < losses[0]
    for key in ("img_per_s", "s_per_step", "peak_mem_gb", "lr"):
        assert key in records[-1]


def test_al03_same_config_identical_losses(tmp_path):
    data = write_npy_latents(tmp_path / "latents", n=16)
    runs = []
    for name in ("a", "b"):
        cfg = tiny_config(tmp_path / name, data={"path": str(data), "random_flip": True},
                          train={"max_steps": 8, "global_batch_size": 4, "mixed_precision": "bf16"})
        DiTTrainer(cfg).train()
        runs.append([r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl")])
    assert runs[0] == runs[1]  # bitwise


def _assert_same_weights(a, b):
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


# "transport": SiT with logit-normal t, the second objective, resumed the same way; the rest are
# the objectives' training options.
_RESUME_CASES = {
    "uniform": {}, "loss-second-moment": {"diffusion": {"timestep_sampler": "loss-second-moment"}},
    "transport": {"objective": "transport", "transport": {"t_sampler": "logit-normal"}, "model": {"name": "SiT-S/2"}},
    "logit-normal": {"diffusion": {"timestep_sampler": "logit-normal", "timestep_mean": 0.5}},
    "lognormal+min-snr": {"diffusion": {"timestep_sampler": "lognormal", "loss_weighting": "min-snr"}},
    "transport-direction": {"objective": "transport", "transport": {"direction_loss_weight": 0.5},
                            "model": {"name": "SiT-S/2"}},
    # token routing draws its subsets from the same generator, so they resume too
    "routing": {"train": {"routing_keep": 0.5, "routing_start": 0, "routing_end": 1}},
    # DiT with RMSNorm, SwiGLU, 2-D RoPE and q/k norms
    "block_options": {"model": {"norm": "rmsnorm", "mlp": "swiglu", "rope": True, "qk_norm": True}},
}


@pytest.mark.parametrize("sampler", list(_RESUME_CASES))
def test_resume_is_exact(tmp_path, sampler):
    """A run resumed from the step-5 checkpoint of an uninterrupted 10-step run ends on its losses and weights:
    mid-epoch (3 steps an epoch), past the warm-up, and through two more epochs."""
    data = write_npy_latents(tmp_path / "latents", n=24)
    case = dict(_RESUME_CASES[sampler])
    routing = case.pop("train", {})

    def cfg(out):
        return tiny_config(out, data={"path": str(data), "random_flip": True, "num_workers": 1}, **case,
                           train={"max_steps": 10, "global_batch_size": 8, "grad_accum_steps": 2,
                                  "mixed_precision": "bf16", **routing},
                           optim={"warmup_steps": 5, "max_grad_norm": 1.0},
                           checkpoint={"save_steps": 5})

    straight = DiTTrainer(cfg(tmp_path / "a"))
    straight.train()
    # The interrupted run: the uninterrupted run's step-5 checkpoint, in a run folder of its own.
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-00000005", tmp_path / "b" / "checkpoints" / "step-00000005")
    resumed = DiTTrainer(cfg(tmp_path / "b"))
    resumed.train()
    assert resumed.step == 10
    _assert_same_weights(straight.model, resumed.model)
    _assert_same_weights(straight.ema, resumed.ema)
    a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(6, 11))
    assert [r["loss"] for r in a if r["step"] > 5] == [r["loss"] for r in b]


def test_a_finished_run_leaves_no_data_worker(tmp_path):
    """train() ends its loader's worker processes itself: left to the garbage collector, a finished trainer (a
    reference cycle) lost its queues first and each worker took the 5 s shutdown timeout to be killed."""
    import multiprocessing

    data = write_npy_latents(tmp_path / "latents", n=8)
    trainer = DiTTrainer(tiny_config(tmp_path / "run", data={"path": str(data), "num_workers": 1},
                                     train={"max_steps": 1, "global_batch_size": 4}))
    before = set(multiprocessing.active_children())
    trainer.train()
    assert set(multiprocessing.active_children()) <= before
    assert next(trainer.loader)[0].shape[0] == 4  # and the loader still goes on, forking new workers
    trainer.loader.stop_workers()
    assert set(multiprocessing.active_children()) <= before


def test_checkpoints_rotate_and_are_atomic(tmp_path):
    data = write_npy_latents(tmp_path / "latents", n=8)
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)},
                      train={"max_steps": 6, "global_batch_size": 4},
                      checkpoint={"save_steps": 2, "save_total_limit": 2})
    DiTTrainer(cfg).train()
    names = [p.name for p in list_checkpoints(tmp_path / "run")]
    assert names == ["step-00000004", "step-00000006"]
    files = sorted(p.name for p in (tmp_path / "run" / "checkpoints" / names[-1]).iterdir())
    assert files == ["config.yaml", "ema.safetensors", "manifest.json", "model.safetensors", "optimizer.pt", "trainer_state.pt"]
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))
    # Everything loads without unpickling code.
    torch.load(tmp_path / "run" / "checkpoints" / names[-1] / "trainer_state.pt", weights_only=True)
    torch.load(tmp_path / "run" / "checkpoints" / names[-1] / "optimizer.pt", weights_only=True)


def test_weights_path_loads_checkpoint_pt_and_safetensors(tmp_path):
    from safetensors.torch import save_file

    source = DiTTrainer(tiny_config(tmp_path / "src"))
    source.train_step((torch.randn(8, 4, 8, 8), torch.randint(0, 10, (8,))))
    ckpt_dir = source.save_checkpoint()
    sd = source.ema.state_dict()
    torch.save(sd, tmp_path / "orig.pt")
    torch.save({"model": source.model.state_dict(), "ema": sd, "opt": {}}, tmp_path / "train.pt")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "w.safetensors"))
    for path in (ckpt_dir, tmp_path / "orig.pt", tmp_path / "train.pt", tmp_path / "w.safetensors"):
        t = DiTTrainer(tiny_config(tmp_path / "dst", model={"weights_path": str(path)}))
        _assert_same_weights(t.model, source.ema)
        _assert_same_weights(t.ema, source.ema)


def test_weights_path_mismatch_is_one_line(tmp_path):
    from dit_trainer.errors import ConfigError

    source = DiTTrainer(tiny_config(tmp_path / "src"))
    torch.save(source.model.state_dict(), tmp_path / "w.pt")
    with pytest.raises(ConfigError) as err:
        DiTTrainer(tiny_config(tmp_path / "dst", model={"weights_path": str(tmp_path / "w.pt"), "input_size": 16}))
    assert "w.pt" in str(err.value) and "model.input_size is 16" in str(err.value) and "\n" not in str(err.value)


def test_global_batch_must_fit_dataset(tmp_path):
    from dit_trainer.errors import DataError

    data = write_npy_latents(tmp_path / "latents", n=3)
    trainer = DiTTrainer(tiny_config(tmp_path / "run", data={"path": str(data)}))
    with pytest.raises(DataError, match="global_batch_size"):
        trainer.train()


def test_dit_train_cli_writes_metrics(tmp_path):
    import yaml

    from dit_trainer.cli import main

    data = write_npy_latents(tmp_path / "latents", n=8)
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)}, train={"max_steps": 3, "global_batch_size": 4})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--train.max_steps", "4", "--optim.lr", "3e-4"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["optim"]["lr"] == 3e-4
    # A typo in an override names the closest key and exits 2 without a traceback.
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--optim.lrr", "1"]) == 2


def test_train_writes_sample_grids_and_tensorboard(tmp_path):
    from PIL import Image

    data = write_npy_latents(tmp_path / "latents", n=8, shape=(3, 8, 8))
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)},
                      model={"in_channels": 3},  # 3 channels: the grid shows them as RGB without a VAE
                      train={"max_steps": 4, "global_batch_size": 4},
                      logging={"image_steps": 2, "sample_steps": 2, "tensorboard": True,
                               "sample_classes": [1, 2], "samples_per_class": 2})
    trainer = DiTTrainer(cfg)
    trainer.train()
    grids = sorted(p.name for p in (tmp_path / "run" / "samples").iterdir())
    assert grids == ["step-00000002.png", "step-00000004.png"]
    grid = Image.open(tmp_path / "run" / "samples" / grids[-1])
    assert grid.size == (2 * 10 + 2, 2 * 10 + 2)  # 2 classes x 2 samples of 8 px, 2 px padding
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
