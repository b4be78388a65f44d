"""Token routing (TREAD, Krause et al., arXiv 2501.04765): during training a random subset of each
image's tokens skips a span of blocks and rejoins the others after it.

Blocks [start, end) see only the kept tokens; the routed ones carry their value from before the
span unchanged past it, where the kept tokens' outputs are scattered back among them. The kept
count is fixed, so a compiled block keeps its graph whichever tokens a step keeps. Positions
ride along: DiT's are added to the tokens before the first block, and a rotary model's blocks
read the kept tokens' original indices. Inference passes no route and uses every token.

The arithmetic (`TokenRouting`) imports no torch: the layout planner prices routed runs with it.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from dit_trainer.errors import ConfigError


class TokenRoute(NamedTuple):
    """One step's routing of a batch: `kept` (B, k) ascending token indices go through blocks [start, end)."""

    kept: Any  # torch.Tensor of int64
    start: int
    end: int

    def part(self, rows: slice, to=None) -> "TokenRoute":
        """The route of the images `rows` (their kept indices passed through `to`, e.g. a device move)."""
        kept = self.kept[rows]
        return self._replace(kept=to(kept) if to else kept)


@dataclass(frozen=True)
class TokenRouting:
    """`train.routing_*` resolved against a model of `depth` blocks: `kept` of its `tokens` go through
    blocks [start, end)."""

    depth: int
    tokens: int
    kept: int
    start: int
    end: int

    @classmethod
    def from_config(cls, train, depth: int, tokens: int) -> Optional["TokenRouting"]:
        """The routing `train` asks of a model of `depth` blocks and `tokens` tokens; None when off."""
        keep, start, end = train.routing_keep, train.routing_start, train.routing_end
        if keep >= 1:
            return None
        stop = end + depth if end < 0 else end
        if not 0 <= start < stop <= depth:
            raise ConfigError(f"train.routing_start {start} and train.routing_end {end} leave no blocks to route of "
                              f"the model's {depth}; pick 0 <= routing_start < routing_end <= {depth} (a negative "
                              "routing_end counts from the last block)")
        kept = int(round(keep * tokens))
        if kept < 1:
            raise ConfigError(f"train.routing_keep {keep} keeps none of the model's {tokens} tokens; raise it")
        return cls(depth, tokens, kept, start, stop)

    @classmethod
    def for_model(cls, train, model) -> Optional["TokenRouting"]:
        """`from_config` for a built model of this project's families (None when off, the model unread)."""
        if train.routing_keep >= 1:
            return None
        return cls.from_config(train, len(model.blocks), (model.input_size // model.patch_size) ** 2)

    @property
    def routed_blocks(self) -> int:
        """How many blocks see only the kept tokens."""
        return self.end - self.start

    def tokens_per_block(self) -> list:
        """The tokens each block computes on, per image."""
        return [self.kept if self.start <= i < self.end else self.tokens for i in range(self.depth)]

    def draw(self, n: int, generator) -> TokenRoute:
        """The kept tokens of `n` images, a random subset of each, drawn from `generator` only."""
        import torch

        order = torch.rand(n, self.tokens, generator=generator).argsort(dim=1)
        return TokenRoute(order[:, :self.kept].sort(dim=1).values, self.start, self.end)


def run_blocks(blocks, tokens, c, route: Optional[TokenRoute] = None, rotary: bool = False,
               capture: Optional[int] = None):
    """`tokens` (B, N, D) through `blocks` under conditioning `c`; with a `route` only the kept ones go
    through blocks [start, end). A `rotary` family's blocks there also take the kept indices (B, k).
    With `capture` = k also returns the tokens after the first k blocks: (tokens, captured)."""
    if capture is not None:
        if route is not None and route.start < capture < route.end:
            raise ConfigError(f"the tokens after block {capture} are a routed subset (blocks {route.start}.."
                              f"{route.end - 1} are routed); move repa.encoder_depth or train.routing_start/end")
        captured = []

        def keep(i, x):
            if i + 1 == capture:
                captured.append(x)

        out = _run(blocks, tokens, c, route, rotary, keep)
        return out, captured[0]
    return _run(blocks, tokens, c, route, rotary)


def _run(blocks, tokens, c, route, rotary, after=None):
    if route is None:
        for i, block in enumerate(blocks):
            tokens = block(tokens, c)
            if after is not None:
                after(i, tokens)
        return tokens
    index = route.kept.unsqueeze(-1).expand(-1, -1, tokens.shape[-1])
    every = tokens
    for i, block in enumerate(blocks):
        if i == route.start:
            every, tokens = tokens, tokens.gather(1, index)
        if rotary and route.start <= i < route.end:
            tokens = block(tokens, c, route.kept)  # positionally: an AC-wrapped forward takes no keywords
        else:
            tokens = block(tokens, c)
        if i == route.end - 1:
            tokens = every.scatter(1, index, tokens.to(every.dtype))
        if after is not None:
            after(i, tokens)
    return tokens
