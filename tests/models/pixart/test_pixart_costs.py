"""`dit plan` prices a PixArt, never pipelined, its caption's tokens counted. (Its parameter counts and a
block's saved activations are held to the model by tests/plan/test_costs.py, as every family's.)"""

from dit_trainer.config import build_config
from dit_trainer.plan import make_request, plan_layouts


def _plans(name):
    return plan_layouts(make_request(build_config(None, ["--model.name", name, "--train.global_batch_size", "64"]),
                                     8, 8, "h100", 80))


def test_dit_plan_prices_pixart_xl_without_pipelining():
    alpha = _plans("PixArt-alpha-XL/2-512")
    assert alpha[0].fits and all(p.layout.pp == 1 for p in alpha)
    assert any(p.layout.tp > 1 for p in alpha) and any(p.layout.dp_shard > 1 for p in alpha)
    # Sigma's 300 caption tokens cost more work than alpha's 120 at the same size.
    compute = {p.layout: p.time.compute for p in alpha}
    assert all(p.time.compute > compute[p.layout] for p in _plans("PixArt-Sigma-XL/2-512"))
