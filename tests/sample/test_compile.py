"""Sampling with compiled blocks: the same samples as eager, one graph for every batch size, and
`--compile auto` deciding by the size of the run."""

import pytest
import torch

from dit_trainer.convert.model_config import build_dit
from dit_trainer.errors import ConfigError
from dit_trainer.sample import sample_latents
from dit_trainer.sample.compile import resolve_sample_compile


def _model():
    torch.manual_seed(0)
    model = build_dit({"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10,
                       "depth": 2, "hidden_size": 32, "num_heads": 2})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "pos_embed":
                p.normal_(0, 0.05)  # the zero-initialised adaLN would make every block the identity
    return model.eval()


@pytest.mark.usefixtures("scalar_kernels")
def test_compiled_sampling_matches_eager_without_recompiling():
    model = _model()
    eager = {n: sample_latents(model, None, list(range(n)), cfg_scale=4.0, sampler="ddim", steps=3, seed=1)
             for n in (3, 5)}
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (3, 5):  # a second grid size, and the doubled CFG batch, reuse the first graph
            compiled = sample_latents(model, None, list(range(n)), cfg_scale=4.0, sampler="ddim", steps=3, seed=1,
                                      compile=True)
            torch.testing.assert_close(compiled, eager[n], rtol=1e-4, atol=1e-4)
    assert model._sampling_compiled and 'forward' in vars(model)  # compiled in place, once


def test_auto_compiles_only_runs_that_repay_it():
    model = _model()  # far below 10M parameters
    assert not resolve_sample_compile("auto", model, 10**6, 1, "cpu")
    assert resolve_sample_compile("true", model, 1, 1, "cpu") and not resolve_sample_compile("false", model, 10**6, 1, "cpu")
    big = torch.nn.Linear(4000, 4000)  # 16M parameters
    assert resolve_sample_compile("auto", big, 1000, 1, "cpu") and not resolve_sample_compile("auto", big, 999, 1, "cpu")
    # Without --steps the fewest default steps (50) are counted: 20 batches make 1000 model calls.
    assert resolve_sample_compile("auto", big, 20, None, "cpu") and not resolve_sample_compile("auto", big, 19, None, "cpu")
    with pytest.raises(ConfigError, match="--compile 'yes'"):
        resolve_sample_compile("yes", model, 1, 1, "cpu")
