"""build_encoder(weights=...): torch-hub files, transformers folders, cached Hugging Face ids; one-line errors."""

import json

import pytest
import torch
from safetensors.torch import save_file

from dit_trainer.encoders import build_encoder, hub_to_transformers
from dit_trainer.encoders.loading import resolve
from dit_trainer.errors import CheckpointError
from tests.encoders.encoder_helpers import TINY, images, tiny_encoder


def outputs(encoder, size=56):
    patches, cls = encoder.encode(images(size=70), size)
    return torch.cat([patches.flatten(), cls.flatten()])


def save_transformers_folder(folder, encoder):
    """config.json and model.safetensors as transformers' save_pretrained lays them out."""
    folder.mkdir()
    shape = encoder.shape
    config = {"model_type": "dinov2", "hidden_size": shape.embed_dim, "num_hidden_layers": shape.depth,
              "num_attention_heads": shape.num_heads, "patch_size": 14, "image_size": shape.img_size,
              "use_swiglu_ffn": shape.swiglu}
    if shape.num_register_tokens:
        config.update(model_type="dinov2_with_registers", num_register_tokens=shape.num_register_tokens)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in hub_to_transformers(encoder.state_dict()).items()},
              str(folder / "model.safetensors"))
    return folder


def one_line(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


@pytest.mark.parametrize("name", ["dinov2_vitb14", "dinov2_vitg14_reg"])
def test_torch_hub_file_and_transformers_folder_give_identical_outputs(tmp_path, name):
    source = tiny_encoder(name)
    torch.save(source.state_dict(), tmp_path / "hub.pth")
    folder = save_transformers_folder(tmp_path / "hf", source)
    from_hub = build_encoder(name, weights=str(tmp_path / "hub.pth"), **TINY)
    from_hf = build_encoder(name, weights=str(folder), **TINY)
    assert torch.equal(outputs(from_hub), outputs(source)) and torch.equal(outputs(from_hf), outputs(source))
    assert not from_hf.training and not any(p.requires_grad for p in from_hf.parameters())


def test_safetensors_file_in_either_layout_and_a_wrapped_bin(tmp_path):
    source = tiny_encoder("dinov2_vitl14_reg")
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "hub.safetensors"))
    wrapped = {f"dinov2.{k}": v for k, v in hub_to_transformers(source.state_dict()).items()}
    wrapped["classifier.weight"] = torch.zeros(3, 2 * source.embed_dim)
    torch.save(wrapped, tmp_path / "pytorch_model.bin")
    for path in ("hub.safetensors", "pytorch_model.bin"):
        loaded = build_encoder("dinov2_vitl14_reg", weights=str(tmp_path / path), **TINY)
        assert torch.equal(outputs(loaded), outputs(source))


def test_a_cached_hugging_face_id_loads_from_the_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    source = tiny_encoder("dinov2_vits14_reg")
    repo = tmp_path / "models--facebook--dinov2-with-registers-small"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots").mkdir()
    save_transformers_folder(repo / "snapshots" / ("0" * 40), source)
    loaded = build_encoder("dinov2_vits14_reg", weights="facebook/dinov2-with-registers-small", **TINY)
    assert torch.equal(outputs(loaded), outputs(source))


def test_an_uncached_id_says_what_to_download(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError) as err:
        build_encoder("dinov2_vitb14", weights="facebook/dinov2-base", **TINY)
    message = one_line(err)
    assert "hf download facebook/dinov2-base" in message and str(tmp_path) in message
    assert "dinov2_vitb14/dinov2_vitb14_pretrain.pth" in message


def test_torch_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(CheckpointError) as err:
        build_encoder("dinov2_vitb14_reg", weights="torch.hub", **TINY)
    assert "dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_reg4_pretrain.pth" in one_line(err)
    source = tiny_encoder("dinov2_vitb14_reg")
    (tmp_path / "checkpoints").mkdir()
    torch.save(source.state_dict(), tmp_path / "checkpoints" / "dinov2_vitb14_reg4_pretrain.pth")
    assert torch.equal(outputs(build_encoder("dinov2_vitb14_reg", weights="torch.hub", **TINY)), outputs(source))


def test_a_missing_file_names_the_download(tmp_path):
    path = tmp_path / "dinov2_vitl14_pretrain.pth"
    with pytest.raises(CheckpointError) as err:
        build_encoder("dinov2_vitl14", weights=str(path), **TINY)
    message = one_line(err)
    assert str(path) in message and "dinov2_vitl14/dinov2_vitl14_pretrain.pth" in message


def test_other_architectures_and_bad_files_are_one_line(tmp_path):
    torch.save(tiny_encoder("dinov2_vitb14_reg").state_dict(), tmp_path / "reg.pth")
    with pytest.raises(CheckpointError, match=r"registers.*\(32, 2, 4\).*\(32, 2, 0\)") as err:
        build_encoder("dinov2_vitb14", weights=str(tmp_path / "reg.pth"), **TINY)
    one_line(err)
    with pytest.raises(CheckpointError, match="build that encoder|pass the encoder name"):
        build_encoder("dinov2_vitb14_reg", weights=str(tmp_path / "reg.pth"), **{**TINY, "depth": 3})
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read encoder weights") as err:
        build_encoder("dinov2_vitb14", weights=str(tmp_path / "junk.pth"), **TINY)
    one_line(err)
    folder = save_transformers_folder(tmp_path / "hf", tiny_encoder("dinov2_vitb14", embed_dim=48, num_heads=3))
    with pytest.raises(CheckpointError, match="has hidden_size 48 but encoder dinov2_vitb14 has 32") as err:
        build_encoder("dinov2_vitb14", weights=str(folder), **TINY)
    one_line(err)
    state = tiny_encoder().state_dict()
    state["blocks.1.mlp.fc3.weight"] = state.pop("blocks.1.mlp.fc2.weight")
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.raises(CheckpointError, match="misses blocks.1.mlp.fc2.weight") as err:
        build_encoder("dinov2_vitb14", weights=str(tmp_path / "renamed.pth"), **TINY)
    one_line(err)


def test_a_checkpoint_with_another_position_grid_loads(tmp_path):
    source = tiny_encoder(img_size=70)
    torch.save(source.state_dict(), tmp_path / "grid5.pth")
    loaded = build_encoder("dinov2_vitb14", weights=str(tmp_path / "grid5.pth"), **TINY)
    assert loaded.pos_embed.shape == source.pos_embed.shape and loaded.shape.img_size == 70
    assert torch.equal(outputs(loaded), outputs(source)) and not loaded.pos_embed.requires_grad


def test_paths_and_ids_are_told_apart(tmp_path):
    with pytest.raises(CheckpointError, match="do not exist"):
        resolve("weights/dinov2_vitb14_pretrain.pth", "dinov2_vitb14")
    with pytest.raises(CheckpointError, match="Hugging Face cache"):
        resolve("nobody-has/this-encoder", "dinov2_vitb14")
