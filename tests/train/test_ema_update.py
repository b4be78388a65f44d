"""update_ema: DiT's rule for trained parameters; frozen ones (pos_embed) stay the model's exactly."""

import torch

from dit_trainer.models import DiT
from dit_trainer.train.ema import create_ema, update_ema


def _tiny():
    torch.manual_seed(0)
    return DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=4)


def _dit_rule(ema, model, decay):
    # The original DiT's train.py update_ema, over every parameter.
    ema_params = dict(ema.named_parameters())
    for name, param in model.named_parameters():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


@torch.no_grad()
def test_frozen_parameters_are_copied_trained_ones_follow_dit():
    model = _tiny()
    assert not model.pos_embed.requires_grad
    ema, reference = create_ema(model), create_ema(model)
    for _ in range(20):
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
        update_ema(ema, model, 0.9999)
        _dit_rule(reference, model, 0.9999)
    # Without the copy pos_embed drifts by rounding; that drift is what the exporters refused.
    assert not torch.equal(reference.pos_embed, model.pos_embed)
    assert torch.equal(ema.pos_embed, model.pos_embed)
    for (name, p), (_, ref) in zip(ema.named_parameters(), reference.named_parameters()):
        if name != "pos_embed":
            assert torch.equal(p, ref), name


def test_decay_warmup_averages_over_fewer_steps_early():
    from dit_trainer.train.ema import ema_decay_at

    # (1 + step) / (10 + step): 0.1 at the first update, 0.91 at step 90, capped by the decay.
    assert abs(ema_decay_at(0, 0.9999, True) - 0.1) < 1e-12
    assert abs(ema_decay_at(90, 0.9999, True) - 0.91) < 1e-12
    assert ema_decay_at(10**6, 0.9999, True) == 0.9999
    assert {ema_decay_at(s, 0.9999, False) for s in (0, 1, 10**6)} == {0.9999}
