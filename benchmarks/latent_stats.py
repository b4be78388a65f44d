"""What `dit extract`'s per-channel statistics cost per shard: `channel_sums` over one full shard
(2048 images, both flips) of each latent space at 256 px, float16 as extract stores it.

    python benchmarks/latent_stats.py
"""

import time

import numpy as np

from dit_trainer.vae.latent_stats import channel_sums

SHARDS = (("sd-vae f8c4, posterior mean + std", (2048, 2, 2, 4, 32, 32)),
          ("AutoencoderKL f16c32, posterior mean + std", (2048, 2, 2, 32, 16, 16)),
          ("AutoencoderDC f32c32, one latent", (2048, 2, 1, 32, 8, 8)))


def main() -> None:
    """Print one markdown row per latent space: shard size, best of three, throughput."""
    rng = np.random.default_rng(0)
    print("| shard (2048 images) | bytes | channel_sums | MiB/s |\n|:--|--:|--:|--:|")
    for name, shape in SHARDS:
        rows = rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            channel_sums(rows)
            best = min(best, time.perf_counter() - start)
        mib = rows.nbytes / 2**20
        print(f"| {name} | {mib:.0f} MiB | {best:.2f} s | {mib / best:.0f} |")


if __name__ == "__main__":
    main()
