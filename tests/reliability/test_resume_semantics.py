"""What a resume does with changed settings and forged state, said out loud: the data position in
samples, a changed seed refused unless allowed, other dtypes and impossible steps as damage."""

import pytest
import torch
from tests.reliability.helpers import edit_weights, names, step_dir, train
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.data.loader import GlobalBatchSampler, StepLoader
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.train import DiTTrainer


def _order(sampler):
    return [i for batch in sampler for i in batch]


def test_position_is_kept_in_samples():
    full = _order(GlobalBatchSampler(8, 2, seed=3))  # one epoch, batches of 2
    loader = StepLoader(list(range(8)), GlobalBatchSampler(8, 2, seed=3))
    for _ in range(2):
        next(loader)
    state = loader.state_dict()
    assert state["sample_in_epoch"] == 4
    bigger = StepLoader(list(range(8)), GlobalBatchSampler(8, 4, seed=3))
    bigger.load_state_dict(state)
    assert _order(bigger.sampler) == full[4:8]  # the next unseen samples, not batch 2 of size 4
    old = StepLoader(list(range(8)), GlobalBatchSampler(8, 4, seed=3))
    old.load_state_dict({"epoch": 0, "batch_in_epoch": 2, "global_batch_size": 2})  # an older checkpoint
    assert old.sampler.sample_in_epoch == 4


def test_changed_batch_size_continues_at_the_sample_and_says_so(tmp_path, capsys):
    train(tmp_path, 2, train={"global_batch_size": 2})
    capsys.readouterr()
    trainer = DiTTrainer(run_config(tmp_path, 3, keep=0, train={"global_batch_size": 4}))
    trainer.loader = trainer.build_loader()
    trainer.maybe_resume()
    assert trainer.loader.sampler.sample_in_epoch == 4
    assert "train.global_batch_size 2 -> 4: the data continues at the sample" in capsys.readouterr().err


def test_changed_seed_is_refused_unless_allowed(tmp_path, capsys):
    train(tmp_path, 4)
    with pytest.raises(ConfigError, match="checkpoint.allow_new_seed true") as err:
        train(tmp_path, 6, train={"seed": 5})
    assert "\n" not in str(err.value) and "train.seed 0" in str(err.value)
    assert names(tmp_path) == ["step-00000002", "step-00000004"]
    capsys.readouterr()
    assert train(tmp_path, 6, train={"seed": 5}, checkpoint={"allow_new_seed": True, "save_steps": 2}).step == 6
    assert "train.seed 0 -> 5" in capsys.readouterr().err


def test_latent_statistics_that_changed_since_the_checkpoint_are_refused_in_one_line(tmp_path):
    import json

    from tests.data.test_shards import make_shards

    from dit_trainer.data.shards import MANIFEST

    data = tmp_path / "shards"
    make_shards(data, counts=(4, 4))

    def extract(mean):  # what `dit extract` records of 4-channel latents it normalises per channel
        manifest = json.loads((data / MANIFEST).read_text())
        manifest.update(latent_norm="channel", latent_mean=[mean, 0.0, 0.0, 0.0], latent_std=[0.5, 1.0, 1.0, 1.0])
        (data / MANIFEST).write_text(json.dumps(manifest))

    def run(steps, **data_keys):
        cfg = run_config(tmp_path, steps, keep=0)
        cfg["data"].update(path=str(data), **data_keys)
        for key in ("input_size", "in_channels", "num_classes"):  # the data decides them
            del cfg["model"][key]
        trainer = DiTTrainer(cfg)
        trainer.train()
        return trainer

    extract(0.1)
    run(2)
    extract(0.2)  # extracted again: the statistics moved
    with pytest.raises(ConfigError) as err:
        run(4)
    message = str(err.value)
    assert "\n" not in message and "step-00000002" in message
    assert "mean [0.1, 0, 0, ...]" in message and "mean [0.2, 0, 0, ...]" in message and "data.latent_mean" in message
    assert names(tmp_path) == ["step-00000002"]
    # The checkpoint's statistics, set in the config, continue it.
    assert run(4, latent_mean=[0.1, 0.0, 0.0, 0.0], latent_std=[0.5, 1.0, 1.0, 1.0]).step == 4


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16])
def test_other_dtype_in_a_checkpoint_is_refused_naming_the_tensor(tmp_path, dtype):
    train(tmp_path, 4)
    edit_weights(step_dir(tmp_path, 4), "model.safetensors",
                 lambda sd: {k: (v.to(dtype) if k == "x_embedder.proj.weight" else v) for k, v in sd.items()})
    with pytest.raises(CheckpointError, match="x_embedder.proj.weight is") as err:
        train(tmp_path, 6, checkpoint={"resume_from": "4", "save_steps": 2})
    assert "\n" not in str(err.value)
    with pytest.warns(UserWarning, match=f"x_embedder.proj.weight is {str(dtype)[6:]} but the model keeps it as float32"):
        assert DiTTrainer(run_config(tmp_path, 6, keep=0)).maybe_resume().name == "step-00000002"


def test_sampling_refuses_integer_weights():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match="weight is int32"):
        ckpt.load_into(model, {"weight": torch.ones(2, 2, dtype=torch.int32), "bias": torch.zeros(2)}, "w.safetensors")
    ckpt.load_into(model, {"weight": torch.ones(2, 2, dtype=torch.float16), "bias": torch.zeros(2)}, "w.safetensors")


@pytest.mark.parametrize("step", [-5, 10**15, 3])
def test_impossible_step_is_a_damaged_checkpoint(tmp_path, step):
    train(tmp_path, 4)
    folder = step_dir(tmp_path, 4)
    state = ckpt.load_pt(folder / "trainer_state.pt")
    state["step"] = step
    torch.save(state, folder / "trainer_state.pt")
    ckpt.write_manifest(folder)
    with pytest.warns(UserWarning, match="trainer_state.pt holds step"):
        trainer = DiTTrainer(run_config(tmp_path, 6, keep=0))
        assert trainer.maybe_resume().name == "step-00000002" and trainer.step == 2
