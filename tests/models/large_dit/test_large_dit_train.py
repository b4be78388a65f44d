"""A tiny Large-DiT learns the scikit-learn digits with DiT's diffusion (falling loss)."""

import torch

from dit_trainer.data.digits import DigitsDataset
from dit_trainer.diffusion import create_diffusion
from dit_trainer.models import get_spec


def test_tiny_large_dit_loss_falls_on_digits():
    torch.manual_seed(0)
    data = DigitsDataset(image_size=16)
    model = get_spec("LargeDiT-600M/2").build_model_fn(
        {"input_size": 16, "in_channels": 1, "num_classes": 10, "dim": 64, "n_layers": 2, "n_heads": 4,
         "n_kv_heads": 2, "qk_norm": True, "multiple_of": 32})
    diffusion = create_diffusion(timestep_respacing="")
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0)
    g = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for _ in range(60):
        idx = torch.randint(0, len(data), (32,), generator=g)
        x, y = data.images[idx], data.labels[idx]
        t = torch.randint(0, diffusion.num_timesteps, (32,), generator=g)
        drop = (torch.rand(32, generator=g) < 0.1).long()  # the trainer draws label dropout itself
        loss = diffusion.training_losses(model, x, t, {"y": y, "force_drop_ids": drop})["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"\ntiny Large-DiT on digits: loss {first:.3f} (first 10 steps) -> {last:.3f} (last 10)")
    assert all(torch.isfinite(torch.tensor(losses)))
    assert last < 0.7 * first, (first, last)
