"""Prompt following on the captioned digits: does a sample show the digit, stroke weight and slant its prompt
asked for?

The digit is read by the digit network (the feature network of the digits' FID, `digits_net`), the
weight and slant by the same pixel measures that wrote the training captions
(`data.digit_attributes`), judged against the asked digit's tertiles. Nothing here is used in any
loss. Shares are reported apart for prompts whose combination was seen in training and for those held
out of it.
"""

import numpy as np
import torch

from dit_trainer.data.digit_attributes import classify, is_held_out, measure

SCORES = ("digit", "weight", "slant", "all")


def read_digits(images, device="cpu", batch_size: int = 512) -> np.ndarray:
    """The digit network's class (int64 (N,)) of N×1×S×S images in [-1, 1], read as its FID reads them (rounded
    to uint8 as the ADM .npz stores them, gray repeated into three channels)."""
    from dit_trainer.evaluate.digits_net import load_digit_net

    net = load_digit_net(device=device)
    x = torch.as_tensor(images).detach().float().cpu()
    out = []
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            chunk = ((x[start:start + batch_size].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
            out.append(net(chunk.expand(-1, 3, -1, -1).contiguous().to(device))["logits"].argmax(1).cpu())
    return torch.cat(out).numpy().astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def matches(images, digits, weights, slants, thresholds, device="cpu") -> dict:
    """Per sample (bool (N,) each): whether its digit, weight, slant, and all three are what was asked
    (`digits`, `weights`, `slants`: the prompts' triples; `thresholds`: the captions' `Thresholds`)."""
    digits = np.asarray(digits, dtype=np.int64)
    mass, slant = measure(images)
    got_w, got_s = classify(mass, slant, digits, thresholds)
    ok = {"digit": read_digits(images, device) == digits, "weight": got_w == np.asarray(weights),
          "slant": got_s == np.asarray(slants)}
    ok["all"] = ok["digit"] & ok["weight"] & ok["slant"]
    return ok


def prompt_following(images, digits, weights, slants, thresholds, device="cpu") -> dict:
    """{"seen": {...}, "held_out": {...}}: each the number of samples `n` and the share matching in digit,
    weight, slant and all three (None where no prompt of that kind was asked)."""
    ok = matches(images, digits, weights, slants, thresholds, device)
    held = is_held_out(digits, weights, slants)
    table = {}
    for name, rows in (("seen", ~held), ("held_out", held)):
        n = int(rows.sum())
        table[name] = {"n": n, **{k: float(ok[k][rows].mean()) if n else None for k in SCORES}}
    return table


def table_lines(table: dict) -> list:
    """The prompt-following table as printed lines (percentages)."""
    lines = [f"{'prompts':<10}{'n':>6}" + "".join(f"{k:>9}" for k in SCORES)]
    for name in ("seen", "held_out"):
        row = table[name]
        cells = "".join(f"{'-':>9}" if row[k] is None else f"{row[k]:>9.1%}" for k in SCORES)
        lines.append(f"{name.replace('_', '-'):<10}{row['n']:>6}{cells}")
    return lines
