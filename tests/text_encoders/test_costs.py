"""`dit plan` counts a text encoder that training runs online: parameters and forward FLOPs from its config.json
(equal to the loaded model's count), its weights sharded over dp_shard under FSDP, nothing for cached embeddings."""

import json

import pytest

from tests.text_helpers import save_tiny_clip, save_tiny_gemma2, save_tiny_t5

pytest.importorskip("transformers")

from dit_trainer.config import build_config  # noqa: E402
from dit_trainer.errors import ConfigError  # noqa: E402
from dit_trainer.plan.layouts import Layout  # noqa: E402
from dit_trainer.plan.memory import Numerics, rank_memory  # noqa: E402
from dit_trainer.plan.search import model_costs  # noqa: E402
from dit_trainer.text_encoders.costs import forward_flops, param_count, read_config  # noqa: E402

# T5 v1.1 XXL's shape (PixArt's and SD3's encoder): 4.76B parameters; only config.json is read.
T5_XXL = {"model_type": "t5", "d_model": 4096, "d_kv": 64, "num_heads": 64, "d_ff": 10240, "num_layers": 24,
          "vocab_size": 32128, "feed_forward_proj": "gated-gelu"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_costs")
    xxl = root / "t5-xxl"
    xxl.mkdir()
    (xxl / "config.json").write_text(json.dumps(T5_XXL))
    (xxl / "spiece.model").write_bytes(b"")  # a tokenizer file: the folder layout dit reads
    return {"t5": save_tiny_t5(root / "t5"), "clip": save_tiny_clip(root / "clip"),
            "gemma2": save_tiny_gemma2(root / "gemma2"), "xxl": str(xxl)}


@pytest.mark.parametrize("kind", ["t5", "clip", "gemma2"])
def test_count_equals_the_loaded_encoders(folders, kind):
    from dit_trainer.text_encoders import load_text_encoder

    encoder = load_text_encoder(folders[kind], "fp32", "cpu")
    loaded = {name: p.numel() for name, p in encoder.model.named_parameters()}  # a tied weight once
    assert param_count(read_config(folders[kind])) == sum(loaded.values()), loaded


def test_t5_xxl_forward_flops_by_hand(folders):
    config = read_config(folders["xxl"])
    assert round(param_count(config) / 1e7) == 476  # 4.76B
    d, inner, ff, layers, tokens = 4096, 64 * 64, 10240, 24, 120
    per_layer = 2 * (4 * d * inner + 3 * d * ff) * tokens + 4 * tokens * tokens * inner
    assert forward_flops(config, tokens) == layers * per_layer


def _pixart(**data):
    return build_config({"model": {"name": "PixArt-alpha-XL/2-256"}, "data": data})


def test_plan_shards_an_online_encoder_and_counts_nothing_for_cached_embeddings(folders, tmp_path):
    plain, online = model_costs(_pixart()), model_costs(_pixart(text_encoder=folders["xxl"]))
    params = param_count(T5_XXL)
    assert online.sharded_frozen_params == params and online.sharded_frozen_bytes == 2 * params  # bf16 on a GPU
    # Its forward per caption (120 tokens), spread over the image's tokens, priced as a third of a train step's.
    assert online.edge_flops - plain.edge_flops == pytest.approx(forward_flops(T5_XXL, 120) / plain.tokens / 3)
    numerics = Numerics.of("bf16", "cuda")
    for shard in (1, 8):
        grew = (rank_memory(online, Layout(dp_shard=shard), 256, numerics)[0].params
                - rank_memory(plain, Layout(dp_shard=shard), 256, numerics)[0].params)
        assert grew == pytest.approx(2 * params / shard)
    # Shards from dit extract hold the embeddings: the encoder never runs.
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text("{}")
    cfg = _pixart(text_encoder=folders["xxl"])
    cfg.data.path = str(shards)
    assert model_costs(cfg).sharded_frozen_bytes == 0


def test_an_encoder_plan_cannot_read_is_one_line():
    with pytest.raises(ConfigError) as err:
        model_costs(_pixart(text_encoder="google/t5-v1_1-xxl-not-cached-here"))
    assert "hf download" in str(err.value) and "\n" not in str(err.value)
