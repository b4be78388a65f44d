import numpy as np


def tiny_config(out, **sections):
    """A config for a DiT small enough for many steps in a test."""
    cfg = {
        "output_dir": str(out),
        "model": {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10,
                  "depth": 2, "hidden_size": 64, "num_heads": 4},
        "data": {"num_workers": 0},
        "train": {"global_batch_size": 8, "max_steps": 10, "device": "cpu", "mixed_precision": "fp32"},
        "checkpoint": {"save_steps": 1000},
        "logging": {"log_steps": 1, "progress": False, "tensorboard": False},
    }
    return with_sections(cfg, sections)


def with_sections(cfg: dict, sections: dict) -> dict:
    """`cfg` with each section's keys updated from `sections` (a non-dict value replaces the entry)."""
    for section, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    return cfg


def write_npy_latents(folder, n=10, shape=(4, 8, 8), num_classes=10, seed=0):
    """n per-image latents and a labels.json beside them."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = {}
    for i in range(n):
        np.save(folder / f"{i:05d}.npy", rng.standard_normal(shape).astype(np.float32))
        labels[f"{i:05d}"] = int(i % num_classes)
    (folder / "labels.json").write_text(json.dumps(labels))
    return folder


def run_config(tmp_path, steps, keep=2, **sections):
    """tiny_config for a run in tmp_path/run on 8 .npy latents written once to tmp_path/latents, batch 4,
    a checkpoint every 2 steps keeping the newest `keep` (0: all) unless `checkpoint` is given."""
    data = tmp_path / "latents"
    if not data.exists():
        write_npy_latents(data, n=8)
    sections.setdefault("checkpoint", {"save_steps": 2, "save_total_limit": keep})
    train = {"max_steps": steps, "global_batch_size": 4, **sections.pop("train", {})}
    return tiny_config(tmp_path / "run", data={"path": str(data)}, train=train, **sections)


def save_tiny_vae(folder):
    """A random 2-level AutoencoderKL (latents 4×8×8 at 16 px)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                  norm_num_groups=8, sample_size=32).save_pretrained(folder)
    return str(folder)


def write_images(root, classes=3, per_class=4, seed=0):
    """RGB images of several sizes in `classes` class folders."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (16 + 5 * i, 20 + c, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.png")
    return str(root)
