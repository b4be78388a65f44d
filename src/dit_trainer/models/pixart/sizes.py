"""PixArt's released models as plain data, free of torch: sizes, and what each release's name implies.

PixArt-alpha (Chen et al., 2023) and PixArt-Sigma (Chen et al., 2024) are one backbone, PixArt-XL/2
(DiT-XL/2's 28 blocks of width 1152, 16 heads, patch 2), conditioned on T5-XXL's 4096-wide token
embeddings. The releases differ in what the name alone does not show in the tensors: the scale of the
sin-cos positions (`interpolation_scale`: PixArt's `lewei_scale` / `pe_interpolation`), whether the
image's resolution and aspect ratio condition the model (alpha 1024's micro-conditions), and the
caption length they were trained with (alpha 120 tokens, Sigma 300).
"""

from dataclasses import dataclass

SIZES = {"XL": (28, 1152, 16)}  # depth, hidden size, heads
PATCH = 2
CAPTION_CHANNELS = 4096  # T5-XXL (t5-v1_1-xxl) hidden states
TEXT_MAX_LENGTH = {"alpha": 120, "Sigma": 300}


@dataclass(frozen=True)
class Release:
    """What a released PixArt's name implies besides its size."""

    version: str  # alpha | Sigma
    resolution: int  # image side in pixels (the latents are an eighth of it)
    interpolation_scale: float  # positions are arange(grid) / interpolation_scale
    micro_conditions: bool  # resolution and aspect-ratio embeddings added to the timestep's

    @property
    def name(self) -> str:
        return f"PixArt-{self.version}-XL/{PATCH}-{self.resolution}"

    @property
    def text_max_length(self) -> int:
        return TEXT_MAX_LENGTH[self.version]


RELEASES = (
    Release("alpha", 256, 1.0, False),
    Release("alpha", 512, 1.0, False),
    Release("alpha", 1024, 2.0, True),
    Release("Sigma", 256, 0.5, False),
    Release("Sigma", 512, 1.0, False),
    Release("Sigma", 1024, 2.0, False),
)
# The Hugging Face repositories' names of the same releases (PixArt-alpha/..., PixArt-alpha/PixArt-Sigma-...).
HUB_NAMES = {
    "PixArt-alpha-XL/2-256": "PixArt-XL-2-256x256",
    "PixArt-alpha-XL/2-512": "PixArt-XL-2-512x512",
    "PixArt-alpha-XL/2-1024": "PixArt-XL-2-1024-MS",
    "PixArt-Sigma-XL/2-256": "PixArt-Sigma-XL-2-256x256",
    "PixArt-Sigma-XL/2-512": "PixArt-Sigma-XL-2-512-MS",
    "PixArt-Sigma-XL/2-1024": "PixArt-Sigma-XL-2-1024-MS",
}


def release(name: str) -> Release:
    """The release registered as `name` (ours or the hub's, any case); KeyError if none."""
    folded = str(name).lower()
    for r in RELEASES:
        if folded in (r.name.lower(), HUB_NAMES[r.name].lower()):
            return r
    raise KeyError(name)
