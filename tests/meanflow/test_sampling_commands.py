"""A MeanFlow run through the sampling commands: `dit sample` draws with MeanFlow's sampler, unguided, in the
run's or the asked steps and records NFE = steps; guidance is refused in one line, as is the export to
diffusers; DiTPipeline samples it in one call."""

import numpy as np
import pytest
import torch
import yaml
from tests.sample.test_sample_cli import tiny_cfg, write_ckpt

from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.convert.pipeline import DiTPipeline
from dit_trainer.errors import ConfigError
from dit_trainer.sample.sampling import sample_latents


@pytest.fixture(scope="module")
def meanflow_ckpt(tmp_path_factory):
    """A checkpoint of a tiny pixel-space DiT trained as MeanFlow (random weights; its config's sample: empty)."""
    cfg = tiny_cfg()
    cfg.objective = "meanflow"
    return write_ckpt(tmp_path_factory.mktemp("meanflow"), cfg)


def _sample(ckpt, npz, *args):
    return main(["sample", "--ckpt", str(ckpt), "--npz", str(npz), "--num-samples", "4", "--batch-size", "4",
                 "--device", "cpu", "--no-progress", *args])


def test_a_meanflow_run_recommends_unguided_sampling(meanflow_ckpt):
    assert build_config(meanflow_ckpt[0] / "config.yaml").sample.cfg_scale == 1.0


def test_sample_records_nfe_equal_to_the_steps(meanflow_ckpt, tmp_path):
    ckpt, _ = meanflow_ckpt
    images = {}
    for steps in (None, 2):  # None: the run's meanflow.steps, 1
        npz = tmp_path / f"s{steps}.npz"
        assert _sample(ckpt, npz, *([] if steps is None else ["--steps", str(steps)])) == 0
        with np.load(npz) as f:
            assert float(f["nfe"]) == (steps or 1)
            images[steps] = f["arr_0"]
    assert not np.array_equal(images[None], images[2])


def test_guided_sampling_of_meanflow_is_one_line(meanflow_ckpt, tmp_path):
    assert _sample(meanflow_ckpt[0], tmp_path / "g.npz", "--cfg-scale", "4") == 2
    with pytest.raises(ConfigError, match="samples unguided"):
        sample_latents(meanflow_ckpt[1], build_config(meanflow_ckpt[0] / "config.yaml"), [1], cfg_scale=2.0, steps=1)


def test_convert_refuses_a_meanflow_run_in_one_line(meanflow_ckpt, tmp_path, capsys):
    assert main(["convert", "--from", "ours", str(meanflow_ckpt[0]), "--to", "diffusers", str(tmp_path / "out")]) == 2
    assert "no custom diffusers pipeline for MeanFlow is written" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["convert", "--from", "ours", str(meanflow_ckpt[0]), "--to", "ours", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert "is a MeanFlow run (objective meanflow), which dit convert does not rewrite" in err and "h_embedder" not in err
    assert not (tmp_path / "again").exists()


def test_pipeline_samples_meanflow_in_one_call(meanflow_ckpt):
    ckpt, model = meanflow_ckpt
    pipe = DiTPipeline.from_pretrained(ckpt)
    got = pipe(class_labels=[1, 2], seed=3, output_type="np")
    cfg = build_config(ckpt / "config.yaml")
    want = sample_latents(model, cfg, [1, 2], cfg_scale=1.0, steps=1, seed=3)
    assert np.allclose(got, ((want.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).numpy(), atol=1e-6)
    assert not np.allclose(got, pipe(class_labels=[1, 2], seed=3, num_inference_steps=2, output_type="np"))


def test_the_training_grid_samples_meanflow_unguided(meanflow_ckpt, tmp_path):
    """logging.sample_cfg_scale (4 by default) guides other objectives' grids; MeanFlow's grid is drawn at 1."""
    from dit_trainer.objective import build_objective
    from dit_trainer.sample.sampling import sample_grid

    ckpt, model = meanflow_ckpt
    cfg = build_config(ckpt / "config.yaml")
    assert cfg.logging.sample_cfg_scale > 1
    path = sample_grid(model, build_objective(cfg), cfg, tmp_path / "grid.png", classes=[1, 2], per_class=1, steps=1)
    assert path.is_file()


def test_a_run_trained_over_a_scale_range_samples_at_the_scale_asked(tmp_path, capsys):
    """`dit sample --cfg-scale` hands a scale inside meanflow.omega_range to the network (one evaluation per
    step); the pipeline's default is the run's omega; a scale outside the range is one line."""
    from tests.sample.test_sample_cli import tiny_model

    from dit_trainer.checkpoint import save_checkpoint

    cfg = tiny_cfg()
    cfg.objective = "meanflow"
    cfg.meanflow.omega_range, cfg.meanflow.omega, cfg.meanflow.kappa = [1.0, 2.0], 1.5, 0.0
    model = tiny_model(cfg)
    with torch.no_grad():  # the scale embedder starts at zero; give it an effect to see
        model.w_embedder.mlp[2].weight.normal_(generator=torch.Generator().manual_seed(0))
    state = model.state_dict()
    files = {"ema.safetensors": state, "model.safetensors": state, "config.yaml": yaml.safe_dump(cfg.to_dict())}
    ckpt = save_checkpoint(tmp_path / "run", 1, files)
    images = {}
    for scale in ("1.2", "1.8"):
        assert _sample(ckpt, tmp_path / f"{scale}.npz", "--cfg-scale", scale) == 0
        with np.load(tmp_path / f"{scale}.npz") as f:
            images[scale] = f["arr_0"]
    assert not np.array_equal(images["1.2"], images["1.8"])
    assert _sample(ckpt, tmp_path / "out.npz", "--cfg-scale", "3") == 2
    assert "outside the scales this run trained on" in capsys.readouterr().err
    got = DiTPipeline.from_pretrained(ckpt)(class_labels=[1, 2], seed=3, output_type="np")
    want = sample_latents(model.eval(), build_config(ckpt / "config.yaml"), [1, 2], cfg_scale=1.5, steps=1, seed=3)
    assert np.allclose(got, ((want.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).numpy(), atol=1e-6)
