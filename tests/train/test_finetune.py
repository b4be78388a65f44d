"""Fine-tuning released weights: the model's shape comes from them, and a class count of one's own
starts only the label embedding anew."""

import numpy as np
import pytest
import torch
from tests.train.trainer_helpers import write_npy_latents

from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.train import DiTTrainer

TABLE = "y_embedder.embedding_table.weight"


def released(path, name, **model):
    """A model of `name` with every weight random (zero inits would hide a missed tensor), saved as a release file."""
    torch.manual_seed(1)
    net = get_spec(name).build_model_fn({"name": name, **model})
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for key, p in net.named_parameters():
            if key != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    torch.save(state, path)
    return state


def run(tmp_path, data, **settings):
    """Settings a user types: the data and run size only, then what the test adds."""
    return {"data.path": str(data), "data.num_workers": 0, "output_dir": str(tmp_path / "run"), "train.device": "cpu",
            "train.mixed_precision": "fp32", "train.global_batch_size": 4, "train.max_steps": 2,
            "logging.progress": False, "logging.tensorboard": False, **settings}


@pytest.fixture
def dit_pt(tmp_path):
    # DiT-S's width (so 6 heads are known) at depth 1: a 1000-class DiT small enough for a test.
    path = tmp_path / "DiT-tiny-1000.pt"
    return path, released(path, "DiT-S/2", depth=1, input_size=8, num_classes=1000)


@pytest.fixture
def three_classes(tmp_path):
    return write_npy_latents(tmp_path / "latents", n=6, num_classes=3)


def test_1000_class_dit_finetunes_on_3_class_image_folder(tmp_path, dit_pt, capsys):
    pytest.importorskip("diffusers")
    from tests.train.trainer_helpers import save_tiny_vae, write_images

    path, weights = dit_pt
    images = write_images(tmp_path / "images", classes=3, per_class=2)
    trainer = DiTTrainer(run(tmp_path, images, **{"data.vae": save_tiny_vae(tmp_path / "vae"), "data.image_size": 16,
                                                  "data.cache_dir": str(tmp_path / "cache"),
                                                  "model.weights_path": str(path), "model.num_classes": 3}))
    m = trainer.cfg.model
    assert (m.name, m.input_size, m.in_channels, m.num_classes, m.learn_sigma) == ("DiT-S/2", 8, 4, 3, True)
    assert m.options == {"depth": 1} and trainer.cfg.data.class_names == ["c0", "c1", "c2"]
    for model in (trainer.model, trainer.ema):
        state = model.state_dict()
        assert set(state) == set(weights)
        for key, value in state.items():
            if key != TABLE:
                assert torch.equal(value, weights[key]), key
        # Three classes and the null class, each starting from the file's null-class row.
        assert torch.equal(state[TABLE], weights[TABLE][-1:].expand(4, -1))
    err = capsys.readouterr().err
    assert err.count("the label embedding starts anew") == 1 and "has 1000 classes" in err
    assert trainer.train()["loss"] > 0


def test_without_num_classes_the_weights_keep_theirs_and_load_whole(tmp_path, dit_pt, three_classes):
    path, weights = dit_pt
    trainer = DiTTrainer(run(tmp_path, three_classes, **{"model.weights_path": str(path)}))
    assert trainer.cfg.model.num_classes == 1000 and trainer.cfg.data.class_names is None
    assert all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())


def test_contradictions_and_labels_outside_are_one_line(tmp_path, dit_pt, three_classes):
    path, _ = dit_pt
    cases = [
        ({"model.input_size": 16}, r"model.input_size is 16 but model.weights_path .*DiT-tiny-1000.pt holds 8"),
        ({"model.depth": 2}, r"model.depth is 2 but .*DiT-tiny-1000.pt holds 1"),
        ({"model.name": "DiT-XL/2"}, r"model.name DiT-XL/2 does not fit .*: its depth is 28, the tensors' 1 \(a DiT-S/2"),
        ({"model.name": "DiT-S/4"}, r"model.name DiT-S/4 does not fit .*tensors are a DiT-S/2, model.depth 1.*\(patch 2\)"),
        ({"model.num_classes": 2}, r"label 2 but the model has 2 classes; set model.num_classes to 3 or more"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            DiTTrainer(run(tmp_path, three_classes, **{"model.weights_path": str(path), **extra}))
        assert "\n" not in str(err.value)
    two = tmp_path / "two.pt"
    released(two, "DiT-S/2", depth=1, input_size=8, num_classes=2)
    with pytest.raises(ConfigError, match=r"has label 2 but the model has 2 classes \(from model.weights_path .*two.pt\)"):
        DiTTrainer(run(tmp_path, three_classes, **{"model.weights_path": str(two)}))
    wide = write_npy_latents(tmp_path / "wide", n=4, shape=(4, 16, 16), num_classes=3)
    with pytest.raises(ConfigError, match=r"weights_path .* is for model.input_size 8 but .* holds 16x16 latents"):
        DiTTrainer(run(tmp_path, wide, **{"model.weights_path": str(path)}))


def _loaded_but_labels(model, weights):
    for key, value in model.state_dict().items():
        if key != TABLE:
            assert torch.equal(value, weights[key]), key
    assert torch.equal(model.state_dict()[TABLE], weights[TABLE][-1:].expand(4, -1))


def test_sit_release_file_takes_the_family_from_the_name(tmp_path, three_classes):
    path = tmp_path / "SiT-tiny.pt"
    weights = released(path, "SiT-S/2", depth=1, input_size=8, num_classes=1000)
    settings = {"model.name": "SiT-S/2", "model.weights_path": str(path), "model.num_classes": 3}
    with pytest.raises(ConfigError, match=r"SiT-S/2 does not fit .*depth is 12, the tensors' 1 \(a SiT-S/2, model.depth 1"):
        DiTTrainer(run(tmp_path, three_classes, **settings))
    trainer = DiTTrainer(run(tmp_path, three_classes, **settings, **{"model.depth": 1}))
    assert trainer.cfg.objective == "transport" and trainer.cfg.model.options == {"depth": 1}
    _loaded_but_labels(trainer.model, weights)


def test_large_dit_release_file_is_recognised_by_its_tensors(tmp_path, three_classes):
    path = tmp_path / "consolidated_ema.00-of-01.pth"
    weights = released(path, "LargeDiT-600M/2", dim=64, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=32,
                       qk_norm=True, input_size=8, num_classes=1000)
    trainer = DiTTrainer(run(tmp_path, three_classes, **{"model.weights_path": str(path), "model.n_heads": 4,
                                                         "model.num_classes": 3}))
    m = trainer.cfg.model
    assert m.name == "LargeDiT-600M/2" and m.input_size == 8  # positions are rotary: the data gives the size
    assert {k: m.options[k] for k in ("dim", "n_layers", "n_kv_heads", "qk_norm")} == \
        {"dim": 64, "n_layers": 1, "n_kv_heads": 2, "qk_norm": True}
    # multiple_of 32 and 64 give the same SwiGLU width: either takes the weights.
    _loaded_but_labels(trainer.model, weights)


def test_our_run_folder_records_its_model(tmp_path, three_classes):
    from tests.train.trainer_helpers import tiny_config

    source = DiTTrainer(tiny_config(tmp_path / "src", model={"name": "SiT-S/2", "num_classes": 3}))
    source.save_checkpoint()
    trainer = DiTTrainer(run(tmp_path, three_classes, **{"model.weights_path": str(tmp_path / "src")}))
    m = trainer.cfg.model
    assert (m.name, m.options, m.num_classes) == ("SiT-S/2", {"depth": 2, "hidden_size": 64, "num_heads": 4}, 3)
    ema = source.ema.state_dict()
    assert all(torch.equal(v, ema[k]) for k, v in trainer.model.state_dict().items())
    assert np.isfinite(trainer.train()["loss"])


@pytest.mark.usefixtures("one_thread")
def test_a_diffusers_pipeline_folder_is_a_weights_path(tmp_path, dit_pt, three_classes):
    """A DiTPipeline folder: its transformer's config gives the model (under diffusers' timestep convention,
    what it computed there), its weights load, its VAE becomes the run's where none is named."""
    pytest.importorskip("diffusers")
    from dit_trainer.convert import Bundle, write
    from tests.train.trainer_helpers import save_tiny_vae

    _, weights = dit_pt
    model = {"name": "DiT-S/2", "depth": 1, "input_size": 8, "num_classes": 1000}
    folder = write("diffusers", Bundle(state_dict=weights, model=model, vae=save_tiny_vae(tmp_path / "vae")),
                   tmp_path / "pipe")
    trainer = DiTTrainer(run(tmp_path, three_classes, **{"model.weights_path": str(folder)}))
    m = trainer.cfg.model
    assert (m.name, m.num_classes, m.options["depth"], m.options["timestep_freq_shift"]) == ("DiT-S/2", 1000, 1, 1)
    assert trainer.cfg.data.vae == str(folder / "vae")
    assert all(torch.equal(trainer.model.state_dict()[k], weights[k]) for k in weights)
