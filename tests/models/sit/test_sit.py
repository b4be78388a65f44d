"""The SiT family: release parameter names, halved learned-σ output, guidance, specs, and a tiny
SiT that learns the digits with TransportObjective."""

import time

import pytest
import torch

from dit_trainer.models import SiT_models, get_spec
from dit_trainer.models.dit import DiT
from dit_trainer.sample.guidance import Guidance, guided_model_fn
from dit_trainer.transport.objective import TransportObjective
from dit_trainer.transport import create_transport

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=5)


def _randomised(model):
    torch.manual_seed(0)
    for p in model.parameters():
        if p.requires_grad:  # keep the frozen sin-cos pos_embed
            torch.nn.init.normal_(p, std=0.05)
    return model.eval()


def test_twelve_names_registered_with_paper_sizes():
    assert sorted(SiT_models) == sorted(f"SiT-{s}/{p}" for s in ("XL", "L", "B", "S") for p in (2, 4, 8))
    model = get_spec("SiT-S/8").build_model_fn({"input_size": 16, "num_classes": 10})
    assert (len(model.blocks), model.blocks[0].attn.num_heads, model.patch_size) == (12, 6, 8)
    assert model.pos_embed.shape[-1] == 384


@pytest.mark.parametrize("learn_sigma", [True, False])
def test_state_dict_is_the_releases_and_forward_halves_learned_sigma(learn_sigma):
    sit = _randomised(SiT_models["SiT-S/2"](**TINY, learn_sigma=learn_sigma))
    dit = DiT(**{**TINY, "patch_size": 2}, learn_sigma=learn_sigma)
    # Same names and shapes as DiT (whose names are the release's), so strict loading works both ways.
    dit.load_state_dict(sit.state_dict(), strict=True)
    assert sit.final_layer.linear.out_features == 2 * 2 * (8 if learn_sigma else 4)
    x, t, y = torch.randn(3, 4, 8, 8), torch.tensor([0.1, 0.5, 0.9]), torch.tensor([0, 4, 2])
    with torch.no_grad():
        out, full = sit(x, t, y), dit.eval()(x, t, y)
        tokens, c = sit.embed(x, t, y)
        for block in sit.blocks:
            tokens = block(tokens, c)
        staged = sit.head(tokens, c)
    assert out.shape == x.shape
    assert torch.equal(out, full[:, :4]) and torch.equal(staged, out)


def test_forward_with_cfg_guides_three_channels_by_default_or_all():
    sit = _randomised(SiT_models["SiT-S/2"](**TINY, learn_sigma=True))
    x = torch.randn(2, 4, 8, 8)
    x2, t, y = torch.cat([x, x]), torch.full((4,), 0.3), torch.tensor([1, 2, 5, 5])
    with torch.no_grad():
        cond, uncond = sit(x, t[:2], y[:2]), sit(x, t[:2], y[2:])
        guided = uncond + 4.0 * (cond - uncond)
        release = sit.forward_with_cfg(x2, t, y, 4.0)
        every = sit.forward_with_cfg(x2, t, y, 4.0, cfg_channels=None)
        helper = guided_model_fn(sit, Guidance(4.0, cfg_channels=4), TransportObjective(create_transport()))(x2, t, y=y)
    assert torch.allclose(release[:2, :3], guided[:, :3], atol=1e-5)
    assert torch.allclose(release[:2, 3:], cond[:, 3:], atol=1e-6)
    assert torch.allclose(every[:2], guided, atol=1e-5) and torch.equal(helper, every)


def test_guidance_interval_skips_the_unconditional_pass_outside():
    sit = _randomised(SiT_models["SiT-S/2"](**TINY, learn_sigma=False))
    x = torch.randn(2, 4, 8, 8)
    x2, y = torch.cat([x, x]), torch.tensor([1, 2, 5, 5])
    # Linear path: sigma = (1 - t) / t, so t 0.4 is sigma 1.5 (inside (0.5, 3]) and t 0.9 is sigma 0.11 (below).
    fn = guided_model_fn(sit, Guidance(3.0, cfg_channels=4, interval=(0.5, 3.0)), TransportObjective(create_transport()))
    with torch.no_grad():
        inside = fn(x2, torch.full((4,), 0.4), y=y)
        outside = fn(x2, torch.full((4,), 0.9), y=y)
        cond = sit(x, torch.full((2,), 0.9), y[:2])
        assert torch.equal(inside, sit.forward_with_cfg(x2, torch.full((4,), 0.4), y, 3.0, cfg_channels=4))
    assert torch.equal(outside[:2], cond) and torch.equal(outside[2:], cond)


def test_tiny_sit_learns_the_digits():
    from dit_trainer.data.digits import DigitsDataset

    data = DigitsDataset(image_size=16)
    x_all, y_all = data.images, torch.as_tensor(data.labels)
    torch.manual_seed(0)
    model = SiT_models["SiT-S/4"](input_size=16, in_channels=1, num_classes=10, depth=2, hidden_size=64,
                                  num_heads=4, learn_sigma=True)
    objective = TransportObjective(create_transport("Linear", "velocity"), learn_sigma=True)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(0)
    eval_idx = torch.arange(256)
    eval_draws = objective.draw(256, (1, 16, 16), torch.Generator().manual_seed(1), "cpu")

    def eval_loss():
        model.eval()
        with torch.no_grad():
            x = x_all[eval_idx]
            x_t, t = objective.model_input(x, eval_draws)
            return float(objective.loss(model(x_t, t, y_all[eval_idx]), x, eval_draws).mean())

    before, start = eval_loss(), time.time()
    for _ in range(40):
        idx = torch.randint(0, len(x_all), (64,), generator=gen)
        x, y = x_all[idx], y_all[idx]
        draws = objective.draw(64, x.shape[1:], gen, "cpu")
        x_t, t = objective.model_input(x, draws)
        model.train()
        loss = objective.loss(model(x_t, t, y), x, draws).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = eval_loss()
    print(f"eval loss {before:.4f} -> {after:.4f}")
    assert after < 0.7 * before, (before, after)
    assert time.time() - start < 30
