"""How DiT's weights map to released checkpoints: our names are facebookresearch/DiT's, so the
map is the identity apart from wrappers that training runs may have added."""


class DiTStateDictAdapter:
    """Released DiT state dict <-> ours."""

    # Prefixes that DDP and torch.compile put in front of every key of a saved state dict.
    WRAPPER_PREFIXES = ("module.", "_orig_mod.")

    def from_released(self, state_dict: dict) -> dict:
        """A released (or DDP/compile-wrapped) state dict in our names."""
        out = {}
        for key, value in state_dict.items():
            for prefix in self.WRAPPER_PREFIXES:
                key = key.removeprefix(prefix)
            out[key] = value
        return out

    def to_released(self, state_dict: dict) -> dict:
        """Our state dict in the release's names (the same)."""
        return dict(state_dict)
