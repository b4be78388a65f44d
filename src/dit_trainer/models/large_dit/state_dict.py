"""How Large-DiT's weights map to Alpha-VLLM's released checkpoints: our names are the release's
(`consolidated[_ema].00-of-01.pth` hold them unprefixed), so the map is the identity apart from the
wrappers that training runs may have added; DiT's adapter already does exactly that."""

from dit_trainer.models.dit.state_dict import DiTStateDictAdapter


class LargeDiTStateDictAdapter(DiTStateDictAdapter):
    """Released Large-DiT state dict <-> ours (same names; DDP/compile prefixes stripped)."""
