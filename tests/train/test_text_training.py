"""A text-conditioned family (PixArt) trains through the unchanged trainer: the condition value reads the
captions, caption dropout replaces the rows drawn from the step generator by the null caption, a resume
is bitwise, and what it cannot do is refused in one line."""

import pytest
import torch

from dit_trainer.errors import ConfigError, DataError
from dit_trainer.parallel.dims import ParallelDims
from dit_trainer.train import DiTTrainer
from dit_trainer.train.preflight import check_layout
from tests.parallel._common import DroppedRows, TinyCaptions, TinyLatents, tiny_config


def _cfg(out, **sections):
    sections.setdefault("train", {}).setdefault("max_steps", 4)
    return tiny_config(out, kind="pixart", checkpoint={"save_steps": 2, "save_total_limit": 0}, **sections)


def test_dropped_captions_are_the_null_caption_on_the_drawn_rows(tmp_path):
    trainer = DiTTrainer(_cfg(tmp_path / "run"), dataset=TinyCaptions())
    dropped = DroppedRows(trainer)
    seen = []
    trainer.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["text_embeds"].clone()), with_kwargs=True)
    data, expected = TinyCaptions(), []
    for step in range(2):
        batch = {k: torch.stack([data[i][k] for i in range(8 * step, 8 * step + 8)]) for k in data[0]}
        # The mask is the step generator's draw right after the objective's (t, noise), as for labels.
        g = torch.Generator()
        g.set_state(trainer.generator.get_state())
        trainer.objective.draw(8, trainer.sample_shape, g, torch.device("cpu"))
        expected.append(torch.nonzero(torch.rand(8, generator=g) < 0.5).flatten().tolist())
        assert trainer.train_step(batch)["loss"] > 0
        kept = [i for i in range(8) if i not in expected[-1]]
        torch.testing.assert_close(seen[-1][kept], batch["text_embeds"][kept].float(), rtol=0, atol=0)
    assert dropped.steps == expected and all(0 < len(rows) < 8 for rows in expected)
    null = data.null_text()["text_embeds"].float()
    assert all(torch.equal(seen[s][i], null) for s, rows in enumerate(expected) for i in rows)


def test_transport_trains_it_through_the_same_condition(tmp_path):
    trainer = DiTTrainer(_cfg(tmp_path / "run", objective="transport"), dataset=TinyCaptions())
    batch = next(iter(torch.utils.data.DataLoader(TinyCaptions(), batch_size=8)))
    losses = [trainer.train_step(batch)["loss"] for _ in range(2)]
    assert all(loss > 0 and loss == loss for loss in losses) and trainer.objective.name == "transport"


def test_resume_is_bitwise(tmp_path):
    """Four steps at once, and two then two more from the step-2 checkpoint: the same losses and weights, bit for bit."""
    from tests.parallel._common import final_weights, read_losses

    DiTTrainer(_cfg(tmp_path / "whole"), dataset=TinyCaptions()).train()
    DiTTrainer(_cfg(tmp_path / "split", train={"max_steps": 2}), dataset=TinyCaptions()).train()
    DiTTrainer(_cfg(tmp_path / "split"), dataset=TinyCaptions()).train()
    assert read_losses(tmp_path / "split") == read_losses(tmp_path / "whole")
    (whole, whole_ema), (split, split_ema) = final_weights(tmp_path / "whole", 4), final_weights(tmp_path / "split", 4)
    assert all(torch.equal(whole[k], split[k]) for k in whole) and all(torch.equal(whole_ema[k], split_ema[k]) for k in whole_ema)


def test_class_data_for_a_text_model_is_one_line(tmp_path):
    with pytest.raises(DataError) as err:
        DiTTrainer(_cfg(tmp_path / "run"), dataset=TinyLatents())
    assert "holds no captions" in str(err.value) and "\n" not in str(err.value)


def test_caption_width_must_match_the_model(tmp_path):
    with pytest.raises(DataError, match="set model.text_hidden_size 16"):
        DiTTrainer(_cfg(tmp_path / "run", model={"text_hidden_size": 32}), dataset=TinyCaptions())


@pytest.mark.parametrize("section", [{"logging": {"image_steps": 2}}, {"eval": {"every": 2}}])
def test_grids_and_fid_without_held_out_captions_are_refused(tmp_path, section):
    # 64 captions: under the 100 a text model holds 1% of by default, so none are held out.
    with pytest.raises(ConfigError) as err:
        DiTTrainer(_cfg(tmp_path / "run", **section), dataset=TinyCaptions()).train()
    assert "held-out captions" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_pipeline_parallel_is_refused_in_one_line(tmp_path):
    cfg = _cfg(tmp_path / "run", parallel={"pp": 2, "dp_shard": 1})
    with pytest.raises(ConfigError) as err:
        check_layout(cfg, ParallelDims(pp=2, dp_shard=1, world_size=2))
    assert "cannot be pipelined" in str(err.value) and "parallel.pp 1" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def t5_shards(tmp_path_factory):
    """`dit extract` of 8 captioned 16 px images with a tiny VAE and a tiny T5 (32 wide, 120 tokens)."""
    pytest.importorskip("transformers")
    from dit_trainer.cli import main
    from tests.text_helpers import save_tiny_t5, write_captioned_folder
    from tests.train.trainer_helpers import save_tiny_vae

    root = tmp_path_factory.mktemp("t5_shards")
    write_captioned_folder(root / "images", count=8)
    assert main(["extract", "--data-path", str(root / "images"), "--vae", save_tiny_vae(root / "vae"),
                 "--image-size", "16", "--out", str(root / "shards"), "--workers", "0", "--no-progress",
                 "--text-encoder", save_tiny_t5(root / "t5")]) == 0
    return root / "shards"


def test_pixart_trains_on_extracted_captions(t5_shards, tmp_path):
    """Shards from `dit extract --text-encoder` give the model its caption width, and the dropped rows are
    the shards' null caption (the encoding of "")."""
    from dit_trainer.data.text_shards import open_shards

    # No text_hidden_size and no input size: the shards give them.
    model = {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 48, "num_heads": 4}
    d = {"output_dir": str(tmp_path / "run"), "model": model,
         "data": {"path": str(t5_shards), "num_workers": 0, "caption_dropout_prob": 0.5},
         "train": {"max_steps": 2, "global_batch_size": 8, "mixed_precision": "fp32", "device": "cpu"},
         "logging": {"log_steps": 1, "tensorboard": False, "progress": False}}
    trainer = DiTTrainer(d)
    assert trainer.cfg.model.options["text_hidden_size"] == 32 and trainer.cfg.data.text_max_length == 120
    assert trainer.cfg.model.input_size == 8
    dropped = DroppedRows(trainer)
    assert trainer.train()["loss"] > 0
    null = open_shards(t5_shards).null_text()["text_embeds"].float()
    assert torch.equal(trainer.condition.null["text_embeds"], null) and sum(map(len, dropped.steps)) > 0
