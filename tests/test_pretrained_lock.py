"""Loads at once in one process (ranks as threads) leave transformers' and torch's class-wide functions
as they were: tying and initialisation still work after them."""

import threading

import pytest
import torch

from tests.text_helpers import save_tiny_t5
from tests.train.trainer_helpers import save_tiny_vae

pytest.importorskip("transformers")
pytest.importorskip("diffusers")


def test_concurrent_loads_leave_tying_and_init_in_place(tmp_path):
    from transformers import PreTrainedModel, T5Config, T5EncoderModel

    from dit_trainer.text_encoders import load_text_encoder
    from dit_trainer.vae import load_vae

    t5, vae = save_tiny_t5(tmp_path / "t5"), save_tiny_vae(tmp_path / "vae")
    tie, normal = PreTrainedModel.tie_weights, torch.nn.init.normal_
    start, errors = threading.Barrier(4), []

    def load(i):
        try:
            start.wait(timeout=60)
            for _ in range(6):
                load_text_encoder(t5) if i % 2 else load_vae(vae)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert PreTrainedModel.tie_weights is tie and torch.nn.init.normal_ is normal
    model = T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4))
    assert model.encoder.embed_tokens.weight is model.shared.weight
