"""Train the digits demo's feature network and write src/dit_trainer/assets/digit_features.safetensors.

Deterministic on one machine (fixed seeds, single thread, deterministic kernels); the shipped
file is the one this wrote, so re-running it is only needed to change the network.

    python scripts/demo/train_digit_features.py [--out PATH] [--epochs 40]
"""

import argparse
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from dit_trainer.data.digits import load_digit_arrays, upsample_digits  # noqa: E402
from dit_trainer.evaluate.digits_net import DIGITS_SIZE, DigitFeatureNet, digit_split  # noqa: E402


def shift(x, gen):
    """Roll each digit by up to one pixel: samples are rarely centred exactly like the scans."""
    dy, dx = torch.randint(-1, 2, (2,), generator=gen).tolist()
    return torch.roll(x, shifts=(dy, dx), dims=(2, 3))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "src/dit_trainer/assets/digit_features.safetensors"))
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    images8, labels = load_digit_arrays()
    x_all = upsample_digits(images8, DIGITS_SIZE)
    y_all = torch.from_numpy(labels)
    train, held = digit_split()
    x, y = x_all[train], y_all[train]

    model = DigitFeatureNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), 64):
            idx = perm[start:start + 64]
            loss = F.cross_entropy(model.classify(shift(x[idx], gen)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if (epoch + 1) % 10 == 0:
            model.eval()
            with torch.no_grad():
                acc = (model.classify(x_all[held]).argmax(1) == y_all[held]).float().mean().item()
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, held-out accuracy {acc:.4f}")

    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"held_out_accuracy": f"{acc:.4f}", "epochs": str(args.epochs), "seed": str(args.seed),
            "trained_on": "sklearn load_digits, 80% stratified split (random_state=0), 16x16 bilinear"}
    save_file(state, args.out, metadata=meta)
    print(f"wrote {args.out} ({sum(v.numel() for v in state.values())} parameters), held-out accuracy {acc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
