"""REPA in the trainer on the digits with a tiny random-weight encoder: both losses fall on either
objective, the resume is bitwise, and the encoder is in no checkpoint and no optimizer state."""

import pytest
import torch
from safetensors import safe_open
from tests.repa._tiny import digits_config

from dit_trainer.errors import DataError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics


@pytest.mark.parametrize("model,objective", [("SiT-S/2", "transport"), ("DiT-S/2", "diffusion"),
                                             ("LargeDiT-600M/2", "diffusion")])
def test_both_losses_fall_on_the_digits(tmp_path, model, objective):
    sizes = {"dim": 32, "n_layers": 2, "n_heads": 2} if model.startswith("Large") else {"depth": 2, "hidden_size": 32,
                                                                                         "num_heads": 2}
    cfg = digits_config(tmp_path, steps=40, objective=objective, logging={"log_steps": 10})
    cfg["model"] = {"name": model, "learn_sigma": False, **sizes}
    DiTTrainer(cfg).train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [10, 20, 30, 40]
    first, last = records[0], records[-1]
    assert last["repa_loss"] < first["repa_loss"] - 0.1, records  # the cosine with the encoder's tokens grows
    assert last["loss"] < first["loss"], records
    assert -1.0 <= last["repa_loss"] <= 1.0
    for r in records:  # the logged total is the two terms, each measured on its own, weighted
        assert r["loss"] == pytest.approx(r["denoising_loss"] + 0.5 * r["repa_loss"], rel=1e-6, abs=1e-7)


def test_the_denoising_term_is_the_plain_objectives_loss_on_the_same_draws(tmp_path):
    # REPA draws nothing and its projector only reads the model's tokens: at the first step (same initial
    # weights, same batch and draws) its denoising term is what the plain objective's loss is.
    DiTTrainer(digits_config(tmp_path / "repa", steps=1)).train()
    plain = digits_config(tmp_path / "plain", steps=1)
    plain.pop("repa")
    DiTTrainer(plain).train()
    (aligned,), (alone,) = read_metrics(tmp_path / "repa" / "metrics.jsonl"), read_metrics(tmp_path / "plain" / "metrics.jsonl")
    assert "repa_loss" not in alone
    assert aligned["denoising_loss"] == pytest.approx(alone["loss"], rel=1e-6)
    assert aligned["loss"] == pytest.approx(alone["loss"] + 0.5 * aligned["repa_loss"], rel=1e-6)


def test_the_encoder_is_in_no_checkpoint_and_holds_no_optimizer_state(tmp_path):
    trainer = DiTTrainer(digits_config(tmp_path, steps=2))
    trainer.train()
    encoder = trainer.alignment.targets.encoder
    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert not optimized & {id(p) for p in encoder.parameters()}
    assert not any(m is encoder for m in trainer.model.modules())
    folder = tmp_path / "checkpoints" / "step-00000002"
    want = {k: tuple(v.shape) for k, v in trainer.model.state_dict().items()}
    assert any(k.startswith("repa_projector.") for k in want)  # the projector is the model's, saved with it
    for name in ("model.safetensors", "ema.safetensors"):
        with safe_open(folder / name, "pt") as f:
            assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == want, name
    state = torch.load(folder / "optimizer.pt", weights_only=True)["state"]
    assert len(state) == sum(1 for p in trainer.model.parameters() if p.requires_grad)
    assert sum(s["exp_avg"].numel() for s in state.values()) == sum(p.numel() for p in trainer.model.parameters()
                                                                   if p.requires_grad)


def _same_weights(a, b):
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_resume_is_bitwise(tmp_path):
    def cfg(out, steps, **checkpoint):
        # The log window (steps 1-4) spans the checkpoint at step 3: its alignment losses resume too.
        return digits_config(out, steps=steps, data={"random_flip": True}, logging={"log_steps": 4},
                             train={"grad_accum_steps": 2}, checkpoint={"save_steps": 3, **checkpoint})

    straight = DiTTrainer(cfg(tmp_path / "a", 6))
    straight.train()
    DiTTrainer(cfg(tmp_path / "b", 6)).train()
    resumed = DiTTrainer(cfg(tmp_path / "b", 6, resume_from=3))  # as after a crash past step 3
    resumed.train()
    assert resumed.step == 6
    _same_weights(straight.model, resumed.model)
    _same_weights(straight.ema, resumed.ema)
    a, b = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [4, 6]
    assert [(r["loss"], r["repa_loss"], r["denoising_loss"]) for r in a] == [
        (r["loss"], r["repa_loss"], r["denoising_loss"]) for r in b]


def test_latents_without_images_are_refused_in_one_line(tmp_path):
    from tests.train.trainer_helpers import write_npy_latents

    data = write_npy_latents(tmp_path / "latents", n=8, shape=(4, 8, 8))
    cfg = digits_config(tmp_path / "run", data={"path": str(data)},
                        model={"input_size": 8, "in_channels": 4, "num_classes": 10})
    with pytest.raises(DataError) as err:
        DiTTrainer(cfg).train()
    assert "--keep-images" in str(err.value) and str(data) in str(err.value) and "\n" not in str(err.value)


def test_mfu_counts_the_projector_and_the_encoder_once(tmp_path):
    import copy

    from dit_trainer.encoders import encoder_flops
    from dit_trainer.models.flops import train_flops_per_image

    trainer = DiTTrainer(digits_config(tmp_path))
    targets, mlp = trainer.alignment.targets, trainer.model.repa_projector
    weights = sum(mlp[i].weight.numel() for i in (0, 2, 4))
    added = 6 * weights * 16 + encoder_flops(targets.encoder, 56)  # 4x4 tokens, 56 px encoder input
    assert targets.tokens == 16 and encoder_flops(targets.encoder, 56) > 0
    bare = copy.deepcopy(trainer.model)
    del bare.repa_projector
    assert trainer.flops_per_image == train_flops_per_image(bare) + added
