"""Scalable Interpolant Transformers (Ma et al., 2024): DiT's backbone trained as a transport model.

SiT keeps DiT's architecture and parameter names (so the release's `SiT-XL-2-256x256.pt` loads
with `strict=True`) and changes what the network means: t is the continuous interpolant time in
[0, 1] (0 noise, 1 data), and the output is a velocity, score or noise prediction with as many
channels as the input. With `learn_sigma` the final layer still has the release's 2·C outputs
(its checkpoints carry them) but only the first half is returned.
"""

from dit_trainer.models.dit.model import DiT, sized_constructors


class SiT(DiT):
    """DiT with continuous t whose forward returns only the prediction channels."""

    def head(self, tokens, c):
        """Final adaLN layer, unpatchify, and with learn_sigma the first C channels only."""
        out = super().head(tokens, c)
        if self.learn_sigma:
            out, _ = out.chunk(2, dim=1)
        return out

    def forward_with_cfg(self, x, t, y, cfg_scale, cfg_channels=3):
        """Classifier-free guidance over a [conditional; unconditional] batch.

        Like the release, guidance applies to the first three output channels by default (its
        published FIDs used that); `cfg_channels=None` guides all `in_channels`, an int that many.
        """
        return super().forward_with_cfg(x, t, y, cfg_scale, cfg_channels=cfg_channels)


SiT_models = sized_constructors(SiT, "SiT")
