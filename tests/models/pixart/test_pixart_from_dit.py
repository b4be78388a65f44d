"""A PixArt starts from a DiT of its shape with one key (`model.weights_path`): the DiT's weights load, the
new ones keep the PixArt's initialisation, adaLN-single is re-parameterised, and one line says so."""

import pytest
import torch
from safetensors.torch import save_file

from dit_trainer.errors import ConfigError
from dit_trainer.train import DiTTrainer
from tests.models.pixart.pixart_helpers import randomize
from tests.parallel._common import TinyCaptions, tiny_config

PIXART = {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 48, "num_heads": 2, "text_hidden_size": 16}


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    """(a tiny DiT of random weights, the .safetensors file holding them)."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    cfg = build_config({"model": {"name": "DiT-S/2", "depth": 2, "hidden_size": 48, "num_heads": 2, "input_size": 8,
                                  "num_classes": 10}})
    model = get_spec("DiT-S/2").build_model_fn(cfg)
    randomize(model, seed=11)
    path = tmp_path_factory.mktemp("dit") / "dit.safetensors"
    save_file(model.state_dict(), str(path))
    return model.eval(), path


@pytest.fixture(scope="module")
def started(dit, tmp_path_factory):
    """(the PixArt a trainer built from the DiT's file, what it printed)."""
    import contextlib
    import io

    err = io.StringIO()
    cfg = tiny_config(tmp_path_factory.mktemp("run"), kind="pixart", model={**PIXART, "weights_path": str(dit[1])})
    with contextlib.redirect_stderr(err):
        trainer = DiTTrainer(cfg, dataset=TinyCaptions())
    return trainer.model.eval(), err.getvalue()


def test_shared_weights_load_and_new_ones_start_as_pixart_does(dit, started):
    (ref, _), (model, _) = dit, started
    theirs, ours = ref.state_dict(), model.state_dict()
    shared = [k for k in ours if k.startswith(("x_embedder.", "t_embedder.", "final_layer.linear.", "blocks.0.attn.",
                                               "blocks.1.mlp."))]
    assert len(shared) == 16 and all(torch.equal(ours[k], theirs[k]) for k in shared)
    assert all(not ours[f"blocks.{i}.cross_attn.proj.weight"].any() for i in range(2))  # adds nothing of the caption yet
    assert ours["y_embedder.y_proj.fc1.weight"].std() < 0.05  # the release's N(0, 0.02), not the DiT's 0.1


def test_at_the_anchor_t_it_is_the_dit_of_the_null_class(dit, started):
    """Section 2.3's re-parameterisation: at t = 500 the PixArt computes the DiT's null-class output, any caption."""
    (ref, _), (model, _) = dit, started
    g = torch.Generator().manual_seed(0)
    x, caption = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 5, 16, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        null = ref(x, torch.full((2,), 500), torch.full((2,), 10))
        assert float((model(x, torch.full((2,), 500), caption, mask) - null).abs().max()) < 1e-4 * float(null.abs().max())
        away = model(x, torch.full((2,), 100), caption, mask) - ref(x, torch.full((2,), 100), torch.full((2,), 10))
    assert float(away.abs().max()) > 1e-3  # one shared t_block is not 28 per-block maps away from the anchor


def test_one_line_says_what_loaded_and_what_is_new(started):
    lines = [line for line in started[1].splitlines() if "is a DiT" in line]
    assert len(lines) == 1
    assert "caption projection" in lines[0] and "cross-attention" in lines[0] and "t_block" in lines[0]


def test_a_dit_of_another_width_is_one_line(dit, tmp_path):
    cfg = tiny_config(tmp_path, kind="pixart", model={**PIXART, "hidden_size": 24, "weights_path": str(dit[1])})
    with pytest.raises(ConfigError) as err:
        DiTTrainer(cfg, dataset=TinyCaptions())
    assert "model.hidden_size is 24" in str(err.value) and "holds 48" in str(err.value) and "\n" not in str(err.value)


def test_a_dit_run_folder_points_at_its_weights_file(tmp_path):
    """Our own DiT run (class-conditional stage 1): the folder names its weights file, which then starts the PixArt."""
    from tests.parallel._common import TinyLatents

    dit_model = {"name": "DiT-S/2", "depth": 2, "hidden_size": 48, "num_heads": 2}
    DiTTrainer(tiny_config(tmp_path / "dit", model=dit_model, train={"max_steps": 1}), dataset=TinyLatents()).train()
    cfg = {**PIXART, "weights_path": str(tmp_path / "dit")}
    with pytest.raises(ConfigError) as err:
        DiTTrainer(tiny_config(tmp_path / "a", kind="pixart", model=cfg), dataset=TinyCaptions())
    weights = tmp_path / "dit" / "checkpoints" / "step-00000001" / "ema.safetensors"
    assert str(weights) in str(err.value) and "\n" not in str(err.value)
    trainer = DiTTrainer(tiny_config(tmp_path / "b", kind="pixart", model={**cfg, "weights_path": str(weights)}),
                         dataset=TinyCaptions())
    assert trainer.train_step(next(iter(torch.utils.data.DataLoader(TinyCaptions(), batch_size=8))))["loss"] > 0
