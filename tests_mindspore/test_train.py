"""Training alignment with the PyTorch path (RFC DIT-AL-01/02/03) and exact resume from .ckpt."""

import os
import shutil

import numpy as np
import pytest
from conftest import MICRO, TINY, copy_into, engine_config, rel, torch, torch_dit

from dit_trainer.diffusion import create_diffusion
from dit_trainer_mindspore.engine import MindSporeTrainer

LR, WD = 1e-3, 0.01


def _torch_step(model, opt, diffusion, x, y, t, noise, drop):
    T = torch.from_numpy
    model.train()
    opt.zero_grad(set_to_none=True)
    x_t = diffusion.q_sample(T(x), T(t), T(noise))
    out = model(x_t, T(t), T(y), force_drop_ids=T(drop).long())
    loss = diffusion.training_losses(lambda *a, **k: out, T(x), T(t), noise=T(noise))["loss"].mean()
    loss.backward()
    opt.step()
    return loss.item()


def _torch_opt(model, lr=LR):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=WD)


def test_one_step_same_loss_gradients_and_updated_weights():
    """At DiT's lr 1e-4. Adam's first step is ~lr·g/(|g|+eps): elements whose gradient is ~1e-9
    move by up to lr on float32 round-off alone, so the weights' agreement scales with lr (1.1e-5
    at lr 1e-3) while the gradients themselves agree to ~1e-6."""
    import mindspore as ms

    lr = 1e-4
    tm = torch_dit(TINY)
    eng = MindSporeTrainer(engine_config(TINY, lr=lr, weight_decay=WD))
    copy_into(eng.model, tm)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 4, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    t, noise, drop = eng.draw(8)
    t[0] = 0  # the decoder-NLL branch of the VB term
    ref = _torch_step(tm, _torch_opt(tm, lr), create_diffusion(""), x, y, t, noise, drop)
    _, grads = eng._grad_fn(ms.Tensor(x), ms.Tensor(y.astype(np.int32)), ms.Tensor(t.astype(np.int32)),
                            ms.Tensor(noise), ms.Tensor(drop))
    tgrads = [p.grad.numpy() for p in tm.parameters() if p.requires_grad]
    assert rel(np.concatenate([g.asnumpy().ravel() for g in grads]), np.concatenate([g.ravel() for g in tgrads])) < 1e-5
    got = eng.train_step((x, y), (t, noise, drop))["loss"]
    assert isinstance(got, float)
    assert abs(got - ref) / abs(ref) < 1e-5
    sd = tm.state_dict()
    pairs = [(p.asnumpy(), sd[n].numpy()) for n, p in eng.model.parameters_and_names()]
    overall = rel(np.concatenate([a.ravel() for a, _ in pairs]), np.concatenate([b.ravel() for _, b in pairs]))
    assert overall < 1e-5
    assert max(rel(a, b) for a, b in pairs) < 1e-4
    # The step really moved the weights (an engine that skipped the update would fail above only by luck).
    before = torch_dit(TINY).state_dict()
    assert rel(sd["final_layer.linear.weight"].numpy(), before["final_layer.linear.weight"].numpy()) > 1e-3


def test_hundred_steps_mean_loss_matches_pytorch():
    """DIT-AL-01/02: same init, data and draws; graph mode (train.compile) for speed."""
    torch.manual_seed(0)
    from dit_trainer.models.dit.model import DiT

    tm = DiT(**MICRO)  # the real adaLN-Zero init
    eng = MindSporeTrainer(engine_config(MICRO, lr=LR, weight_decay=WD, train={"compile": True}))
    copy_into(eng.model, tm)
    opt, diffusion = _torch_opt(tm), create_diffusion("")
    rng = np.random.default_rng(2)
    data = rng.standard_normal((16, 4, 4, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 16)
    ms_losses, pt_losses = [], []
    for step in range(100):
        idx = np.random.default_rng([0, step]).choice(16, 4, replace=False)
        draws = eng.draw(4, step)
        pt_losses.append(_torch_step(tm, opt, diffusion, data[idx], labels[idx], *draws))
        ms_losses.append(eng.train_step((data[idx], labels[idx]), draws)["loss"])
    assert abs(np.mean(ms_losses) - np.mean(pt_losses)) < 5e-3
    assert np.mean(ms_losses[-20:]) < np.mean(ms_losses[:20])  # it learns


@pytest.fixture(scope="module")
def latents(tmp_path_factory):
    root = tmp_path_factory.mktemp("latents")
    rng = np.random.default_rng(3)
    for i in range(12):
        np.save(root / f"{i:03d}.npy", rng.standard_normal((4, 4, 4)).astype(np.float32))
    np.save(root / "labels.npy", rng.integers(0, 4, 12))
    return str(root)


def _run(latents, out, steps):
    cfg = engine_config(MICRO, data_path=latents, output_dir=str(out), batch_size=4, max_steps=steps, lr=LR,
                        checkpoint={"save_steps": 3}, train={"ema_decay": 0.9})
    eng = MindSporeTrainer(cfg)
    result = eng.train()
    return eng, result


def test_same_seed_runs_equal_and_ckpt_resume_is_exact(latents, tmp_path):
    a, ra = _run(latents, tmp_path / "a", 6)
    b, rb = _run(latents, tmp_path / "b", 6)  # DIT-AL-03: a second run from the same seed
    assert a.step == b.step == 6
    assert abs(ra["loss"] - rb["loss"]) < 1e-4
    wa, wb = dict(a.model.parameters_and_names()), dict(b.model.parameters_and_names())
    assert max(rel(wa[n].asnumpy(), wb[n].asnumpy()) for n in wa) < 1e-4
    assert sorted(os.listdir(tmp_path / "a" / "checkpoints")) == ["step-00000003.ckpt", "step-00000006.ckpt"]
    # Resume: only the step-3 checkpoint, then train to 6: the same weights, EMA and moments as a.
    (tmp_path / "c" / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "a" / "checkpoints" / "step-00000003.ckpt", tmp_path / "c" / "checkpoints")
    c, _ = _run(latents, tmp_path / "c", 6)
    assert c.step == 6
    for n, p in c.model.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), wa[n].asnumpy())
    ema_a, ema_c = a.ema_weights(), c.ema_weights()
    for n in ema_a:
        np.testing.assert_array_equal(ema_c[n], ema_a[n])
    assert not np.array_equal(ema_a["final_layer.linear.weight"], wa["final_layer.linear.weight"].asnumpy())
    for pa, pc in zip(a.exp_avg_sq, c.exp_avg_sq):
        np.testing.assert_array_equal(pc.asnumpy(), pa.asnumpy())


def test_build_trainer_backend_mindspore_returns_float_loss():
    from dit_trainer import build_trainer

    trainer = build_trainer({**engine_config(MICRO), "model_name": "DiT-S/2", "batch_size": 2})
    assert type(trainer).__name__ == "MindSporeTrainer" and trainer.is_main
    rng = np.random.default_rng(0)
    batch = (torch.from_numpy(rng.standard_normal((2, 4, 4, 4)).astype(np.float32)), torch.tensor([1, 3]))
    out = trainer.train_step(batch)
    assert isinstance(out["loss"], float) and np.isfinite(out["loss"])


def test_a_decaying_learning_rate_is_refused_in_one_line():
    from dit_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="optim.lr_schedule cosine is not supported with backend mindspore") as err:
        MindSporeTrainer(engine_config(MICRO, optim={"lr_schedule": "cosine"}))
    assert "\n" not in str(err.value)
