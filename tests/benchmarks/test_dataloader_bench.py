"""benchmarks/dataloader.py at a tiny size: every latent format delivers the whole dataset each
epoch at a measurable rate, `dit extract` encodes every image, and the image-folder path times its
first and cached epochs."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_format_delivers_every_latent(tmp_path):
    numbers = tmp_path / "dataloader.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dataloader.py"), "--num", "48", "--workers", "0",
                          "--batch-size", "16", "--epochs", "1", "--shard-size", "32", "--extract-images", "6", "--online-images", "8",
                          "--dir", str(tmp_path), "--json", str(numbers)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(numbers.read_text())
    assert len(data["loaders"]) == 3  # per-file .npy, converted shards, extract layout
    for name, loader in data["loaders"].items():
        assert loader["latents_per_epoch"] == 48, name  # 48 over two shards of 32: the partial one counts
        assert loader["latents_per_s"] > 0, name
    extract = data["extract"]
    assert extract["images"] == 6 and extract["images_per_s"] > 0 and extract["pipeline_images_per_s"] > 0
    online = data["online"]
    assert online["images"] == 8 and all(online[k] > 0 for k in ("precomputed", "first_epoch", "completing_epoch", "cached"))
    assert list(tmp_path.iterdir()) == [numbers]  # the scratch data is gone
