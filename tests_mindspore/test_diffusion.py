"""q_sample and the training loss (learned sigma with the VB term) against dit_trainer.diffusion."""

import numpy as np
import pytest
from conftest import rel, torch

from dit_trainer.diffusion import create_diffusion
from dit_trainer_mindspore.diffusion import GaussianDiffusion


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_q_sample_and_losses_equal_pytorch(schedule):
    import mindspore as ms

    ref, ours = create_diffusion("", noise_schedule=schedule), GaussianDiffusion(noise_schedule=schedule)
    np.testing.assert_array_equal(ours.sqrt_alphas_cumprod, ref.sqrt_alphas_cumprod)
    np.testing.assert_array_equal(ours.posterior_log_variance_clipped, ref.posterior_log_variance_clipped)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (6, 4, 8, 8)).astype(np.float32)
    noise = rng.standard_normal(x.shape).astype(np.float32)
    out = rng.standard_normal((6, 8, 8, 8)).astype(np.float32)
    t = np.array([0, 1, 10, 300, 998, 999])
    T = torch.from_numpy
    q_ref = ref.q_sample(T(x), T(t), T(noise)).numpy()
    q_ms = ours.q_sample(ms.Tensor(x), ms.Tensor(t.astype(np.int32)), ms.Tensor(noise)).asnumpy()
    assert rel(q_ms, q_ref) < 1e-6
    terms_ref = ref.training_losses(lambda *a, **k: T(out), T(x), T(t), noise=T(noise))
    terms_ms = ours.training_losses(ms.Tensor(out), ms.Tensor(x), ms.Tensor(t.astype(np.int32)), ms.Tensor(noise))
    for key in ("loss", "mse", "vb"):
        assert rel(terms_ms[key].asnumpy(), terms_ref[key].numpy()) < 1e-5, key
    # The t=0 decoder NLL differs in kind from the KL: both branches were taken.
    assert terms_ref["vb"][0] > 10 * terms_ref["vb"][3]


def test_unsupported_loss_is_a_config_error():
    from dit_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="use_kl"):
        GaussianDiffusion(use_kl=True)
