"""Token routing (TREAD): the span and kept count from the config, the per-step draw, what the
blocks loop does with a route in every family, inference on every token, and no recompiles."""

import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from dit_trainer.errors import ConfigError
from dit_trainer.models import DiT, SiT_models
from dit_trainer.models.large_dit.model import DiT_Llama
from dit_trainer.models.routing import TokenRoute, TokenRouting, run_blocks

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_DIT = dict(input_size=8, in_channels=4, hidden_size=32, depth=4, num_heads=2, num_classes=5)
TINY_LDIT = dict(input_size=8, in_channels=4, dim=32, n_layers=4, n_heads=2, n_kv_heads=1, num_classes=5, qk_norm=True)
FAMILIES = {
    "dit": lambda: DiT(**TINY_DIT),
    "sit": lambda: SiT_models["SiT-S/2"](**TINY_DIT),
    # 2-D RoPE: routed tokens must rotate by their own grid places, not the first k of the table
    "dit_rope": lambda: DiT(**TINY_DIT, rope=True, qk_norm=True),
    "large_dit": lambda: DiT_Llama(**TINY_LDIT),
}


def _train(keep=0.5, start=1, end=-1):
    return SimpleNamespace(routing_keep=keep, routing_start=start, routing_end=end)


def _randomised(model):
    # adaLN-Zero starts every block as the identity: random weights make each block matter.
    torch.manual_seed(0)
    for p in model.parameters():
        if p.requires_grad:
            nn.init.normal_(p, std=0.05)
    return model


def _inputs(n=3):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, 8, 8, generator=g)
    return x, torch.randint(0, 1000, (n,), generator=g).float(), torch.randint(0, 5, (n,), generator=g)


def test_span_and_kept_count_come_from_the_config():
    assert TokenRouting.from_config(_train(keep=1.0), 28, 256) is None  # off: the model is not even read
    r = TokenRouting.from_config(_train(keep=0.5, start=2, end=-2), 28, 256)
    assert (r.start, r.end, r.kept, r.routed_blocks) == (2, 26, 128, 24)
    assert r.tokens_per_block() == [256] * 2 + [128] * 24 + [256] * 2
    assert TokenRouting.from_config(_train(keep=0.3, start=0, end=3), 3, 16).kept == 5  # round(4.8)


@pytest.mark.parametrize("train,needle", [
    (_train(start=2, end=-2), "train.routing_start 2 and train.routing_end -2 leave no blocks to route of the model's 4"),
    (_train(start=0, end=9), "train.routing_end 9"),
    (_train(start=-1, end=3), "train.routing_start -1"),
    (_train(keep=0.01), "train.routing_keep 0.01 keeps none of the model's 16 tokens"),
])
def test_bad_routing_is_one_line_naming_the_key(train, needle):
    with pytest.raises(ConfigError) as info:
        TokenRouting.from_config(train, 4, 16)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_each_draw_is_a_fresh_subset_from_the_generator_only():
    r = TokenRouting.from_config(_train(keep=0.25), 4, 16)
    g = torch.Generator().manual_seed(0)
    first, second = r.draw(6, g), r.draw(6, g)
    assert first.kept.shape == (6, 4) and (first.start, first.end) == (1, 3)
    for row in first.kept:
        assert torch.equal(row, row.sort().values) and len(set(row.tolist())) == 4
    assert not torch.equal(first.kept, second.kept)
    again = r.draw(6, torch.Generator().manual_seed(0))
    assert torch.equal(first.kept, again.kept)
    assert torch.equal(first.part(slice(2, 4)).kept, first.kept[2:4])


class _Add(nn.Module):
    """A block that adds its number to every token (and records the positions it was given)."""

    def __init__(self, value):
        super().__init__()
        self.value, self.positions = value, None

    def forward(self, x, c, positions=None):
        self.positions = positions
        return x + self.value


def test_routed_tokens_skip_the_span_and_rejoin_after_it():
    blocks = [_Add(1.0), _Add(10.0), _Add(100.0), _Add(1000.0)]
    tokens = torch.zeros(2, 5, 3)
    kept = torch.tensor([[0, 3], [1, 4]])
    out = run_blocks(blocks, tokens, None, TokenRoute(kept, 1, 3), rotary=True)
    for b in range(2):
        for i in range(5):
            expected = 1111.0 if i in kept[b].tolist() else 1001.0
            assert torch.equal(out[b, i], torch.full((3,), expected)), (b, i)
    # Only the span's blocks see the kept tokens' positions.
    assert blocks[0].positions is None and blocks[3].positions is None
    assert torch.equal(blocks[1].positions, kept) and torch.equal(blocks[2].positions, kept)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_route_that_keeps_every_token_shuffled_changes_nothing(family):
    """Tokens keep their own positions through the span: DiT's embedded ones, the rotary ones of DiT's
    `model.rope` and of Large-DiT."""
    model = _randomised(FAMILIES[family]()).train()
    x, t, y = _inputs()
    drop = torch.zeros(3, dtype=torch.long)
    shuffled = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(i)) for i in range(3)])
    with torch.no_grad():
        full = model(x, t, y, force_drop_ids=drop)
        routed = model(x, t, y, force_drop_ids=drop, route=TokenRoute(shuffled, 1, 3))
        half = model(x, t, y, force_drop_ids=drop, route=TokenRoute(shuffled[:, :8], 1, 3))
    torch.testing.assert_close(routed, full, rtol=1e-5, atol=1e-5)
    assert (half - full).abs().max() > 1e-3  # a real subset does change the output


@pytest.mark.parametrize("family", list(FAMILIES))
def test_inference_uses_every_token(family):
    model = _randomised(FAMILIES[family]()).eval()
    x, t, y = _inputs()
    route = TokenRouting.for_model(_train(), model).draw(3, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(x, t, y, route=route), model(x, t, y))


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="inductor needs a C compiler on CPU")
@pytest.mark.parametrize("family", ["dit", "large_dit"])
@pytest.mark.usefixtures("scalar_kernels")
def test_routing_under_per_block_compile_never_recompiles(family):
    """The kept count is fixed, so a fresh subset each step reuses the compiled blocks' graphs."""
    from torch._dynamo.utils import counters

    from dit_trainer.parallel import apply_compile

    torch._dynamo.reset()
    model = _randomised(FAMILIES[family]()).train()
    apply_compile(list(model.blocks))
    routing = TokenRouting.for_model(_train(), model)
    g = torch.Generator().manual_seed(0)
    counters.clear()

    def step():
        x, t, y = _inputs(4)
        model(x, t, y, force_drop_ids=torch.zeros(4, dtype=torch.long), route=routing.draw(4, g)).square().mean().backward()

    step()
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            step()
    assert counters["stats"]["unique_graphs"] == graphs
