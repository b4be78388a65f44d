"""The torch-hub and transformers layouts of DINOv2 weights map onto each other exactly."""

import pytest
import torch

from dit_trainer.encoders import hub_to_transformers, transformers_to_hub
from dit_trainer.encoders.layouts import is_transformers_layout, strip_prefixes
from tests.encoders.encoder_helpers import tiny_encoder

# transformers' Dinov2Model / Dinov2WithRegistersModel names (its convert_dinov2_to_hf.py mapping).
TRANSFORMERS_TOP = {"embeddings.cls_token", "embeddings.mask_token", "embeddings.position_embeddings",
                    "embeddings.patch_embeddings.projection.weight", "embeddings.patch_embeddings.projection.bias",
                    "layernorm.weight", "layernorm.bias"}
TRANSFORMERS_BLOCK = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                      "layer_scale1.lambda1", "layer_scale2.lambda1",
                      "attention.output.dense.weight", "attention.output.dense.bias"} | {
    f"attention.attention.{p}.{k}" for p in ("query", "key", "value") for k in ("weight", "bias")}
FFN = {False: {"mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"},
       True: {"mlp.weights_in.weight", "mlp.weights_in.bias", "mlp.weights_out.weight", "mlp.weights_out.bias"}}


@pytest.mark.parametrize("name", ["dinov2_vitb14", "dinov2_vitg14_reg"])
def test_transformers_names(name):
    encoder = tiny_encoder(name, depth=1)
    hf = hub_to_transformers(encoder.state_dict())
    expected = TRANSFORMERS_TOP | {f"encoder.layer.0.{k}" for k in TRANSFORMERS_BLOCK | FFN[encoder.shape.swiglu]}
    if encoder.num_register_tokens:
        expected.add("embeddings.register_tokens")
    assert set(hf) == expected and is_transformers_layout(hf)
    qkv, dim = encoder.blocks[0].attn.qkv.weight, encoder.embed_dim
    for i, part in enumerate(("query", "key", "value")):
        assert torch.equal(hf[f"encoder.layer.0.attention.attention.{part}.weight"], qkv[i * dim:(i + 1) * dim])


@pytest.mark.parametrize("name", ["dinov2_vits14", "dinov2_vitl14_reg", "dinov2_vitg14", "dinov2_vitg14_reg"])
def test_round_trip_gives_the_same_tensors_and_outputs(name):
    source = tiny_encoder(name)
    state = source.state_dict()
    back = transformers_to_hub(hub_to_transformers(state))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    target = tiny_encoder(name, seed=7)
    target.load_state_dict(transformers_to_hub(hub_to_transformers(state)), strict=True)
    x = torch.rand(2, 3, 70, 70, generator=torch.Generator().manual_seed(3))
    assert torch.equal(target.encode(x, 56)[0], source.encode(x, 56)[0])
    assert torch.equal(target.encode(x, 224)[1], source.encode(x, 224)[1])


def test_wrapper_prefixes_are_stripped():
    state = {"dinov2.embeddings.cls_token": torch.zeros(1), "dinov2.layernorm.weight": torch.zeros(1),
             "classifier.weight": torch.zeros(1)}  # Dinov2ForImageClassification's head is not the backbone's
    assert set(strip_prefixes(state)) == {"embeddings.cls_token", "layernorm.weight"}
    assert set(strip_prefixes({"backbone.cls_token": 1, "backbone.norm.weight": 2})) == {"cls_token", "norm.weight"}
    wrapped = {"dinov2_with_registers.embeddings.register_tokens": 1, "classifier.bias": 2}
    assert set(strip_prefixes(wrapped)) == {"embeddings.register_tokens"}
