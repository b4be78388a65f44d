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
