"""Bad inputs fail with CheckpointError naming the file and what is wrong."""

import os
import pickle

import numpy as np
import pytest
import torch

from dit_trainer.convert import convert, read
from dit_trainer.convert.pdparams import load_pdparams, save_pdparams
from dit_trainer.errors import CheckpointError

from tests.convert.convert_helpers import TINY, randomize


def _release_pt(path, cfg=TINY):
    from dit_trainer.convert.model_config import build_dit

    torch.save(randomize(build_dit(cfg)).state_dict(), path)
    return path


def test_truncated_pt(tmp_path):
    path = _release_pt(tmp_path / "DiT.pt")
    path.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])
    with pytest.raises(CheckpointError, match="DiT.pt"):
        read("dit-pt", path)


def test_foreign_pt(tmp_path):
    path = tmp_path / "resnet.pt"
    torch.save({"conv1.weight": torch.zeros(8, 3, 3, 3), "fc.bias": torch.zeros(8)}, path)
    with pytest.raises(CheckpointError, match="not a DiT state dict.*x_embedder"):
        read("dit-pt", path)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pt_holding_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"x_embedder.proj.weight": torch.zeros(1), "hook": _Payload()}, path)
    with pytest.raises(CheckpointError, match="weights-only"):
        read("dit-pt", path)


def test_pdparams_holding_code(tmp_path):
    path = tmp_path / "model_state.pdparams"
    path.write_bytes(pickle.dumps({"w": np.zeros(3, dtype=np.float32), "x": _Payload()}))
    with pytest.raises(CheckpointError, match="posix.system|nt.system|more than numpy arrays"):
        load_pdparams(path)


@pytest.mark.parametrize("value", [[1, 2], np.array(["a", None], dtype=object), "text"])
def test_pdparams_holding_non_arrays(tmp_path, value):
    path = tmp_path / "model_state.pdparams"
    path.write_bytes(pickle.dumps({"w": np.zeros(3, dtype=np.float32), "x": value}))
    with pytest.raises(CheckpointError, match="model_state.pdparams"):
        load_pdparams(path)


def test_pdparams_round_trip_transposes_linears(tmp_path):
    sd = {"a.weight": torch.randn(3, 5), "emb.embedding_table.weight": torch.randn(4, 2),
          "conv.weight": torch.randn(2, 3, 1, 1), "a.bias": torch.randn(3)}
    save_pdparams(sd, tmp_path / "m.pdparams")
    with open(tmp_path / "m.pdparams", "rb") as f:
        raw = pickle.load(f)
    assert raw["a.weight"].shape == (5, 3) and raw["emb.embedding_table.weight"].shape == (4, 2)
    back = load_pdparams(tmp_path / "m.pdparams")
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_differing_per_block_embedders_refused(ours_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    out, _ = convert("ours", ours_dir, "diffusers", tmp_path / "d")
    f = out / "transformer" / "diffusion_pytorch_model.safetensors"
    sd = load_file(str(f))
    sd["transformer_blocks.1.norm1.emb.timestep_embedder.linear_1.bias"] += 1
    save_file(sd, str(f))
    with pytest.raises(CheckpointError, match="transformer_blocks.1.norm1.emb.timestep_embedder.linear_1.bias differs"):
        read("diffusers", out)


def test_wrong_model_name_names_key_and_fit(tmp_path):
    path = _release_pt(tmp_path / "DiT.pt")
    with pytest.raises(CheckpointError, match=r"pos_embed is \(1, 16, 64\) but DiT-B/2 has \(1, 16, 768\).*missing blocks.2.*fit \(depth 2, hidden 64"):
        read("dit-pt", path, model="DiT-B/2")


@pytest.mark.parametrize("fmt", ["diffusers", "ppdiffusers"])
def test_missing_or_empty_pipeline_folder_names_it(tmp_path, fmt):
    missing, empty = tmp_path / "out" / "nonexist", tmp_path / "out" / "empty"
    empty.mkdir(parents=True)
    with pytest.raises(CheckpointError, match=f"^{missing} does not exist; pass a {fmt} DiTPipeline folder"):
        read(fmt, missing)
    with pytest.raises(CheckpointError, match=f"is {empty} a {fmt} DiTPipeline folder"):
        read(fmt, empty)


def test_export_with_an_uncached_hub_vae_offline_fails_at_once(ours_dir, tmp_path, offline_hub):
    # The exporters load their VAE through data.vae's loader: one short Hub probe, not ~30 s of retries.
    from dit_trainer.vae import autoencoder as vae_mod
    from dit_trainer.errors import DitError

    with pytest.raises(DitError) as err:
        convert("ours", ours_dir, "diffusers", tmp_path / "d", vae="org/uncached-vae")
    assert "'org/uncached-vae' is not in the Hugging Face cache" in str(err.value) and "\n" not in str(err.value)
    assert offline_hub == [vae_mod.HUB_PROBE_TIMEOUT_S]
    assert not (tmp_path / "d" / "vae").exists()


def test_pixel_model_export_says_it_has_no_pipeline_form(vae_dir, tmp_path):
    from dit_trainer.convert import write
    from dit_trainer.convert.model_bundle import Bundle
    from dit_trainer.convert.model_config import build_dit
    from dit_trainer.errors import ConfigError

    cfg = {**TINY, "in_channels": 1}
    bundle = Bundle(state_dict=build_dit(cfg).state_dict(), model=cfg, source="digits-run")
    with pytest.raises(ConfigError, match="digits-run records no VAE.*trained on pixels.*no DiTPipeline form"):
        write("diffusers", bundle, tmp_path / "d")
    # The VAE the message asks for must make the latents the model takes, or the pipeline fails on first use.
    bundle.vae = str(vae_dir)
    with pytest.raises(ConfigError, match="makes 4-channel latents but the model takes 1 channels"):
        write("diffusers", bundle, tmp_path / "d")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("fmt", ["diffusers", "ppdiffusers"])
def test_block_options_refuse_export_in_one_line(vae_dir, tmp_path, fmt):
    # Their DiT transformer has the release's block only: each option is named, nothing is written.
    from dit_trainer.convert import write
    from dit_trainer.convert.model_bundle import Bundle
    from dit_trainer.convert.model_config import build_dit
    from dit_trainer.errors import ConfigError

    for options, named in (({"mlp": "swiglu", "qk_norm": True}, "model.mlp swiglu, model.qk_norm true"),
                           ({"rope": True}, "model.rope true"), ({"norm": "rmsnorm"}, "model.norm rmsnorm")):
        cfg = {**TINY, **options}
        bundle = Bundle(state_dict=build_dit(cfg).state_dict(), model=cfg, vae=vae_dir, source="run")
        with pytest.raises(ConfigError, match=f"uses {named}, but .* has only the release's DiT block") as err:
            write(fmt, bundle, tmp_path / fmt)
        assert "\n" not in str(err.value)
    assert not (tmp_path / fmt).exists()


def test_block_options_refuse_mindspore(tmp_path):
    # The MindSpore DiT (weights and the backend's config) has the release's block only; torch-free checks.
    from dit_trainer.config import build_config
    from dit_trainer.convert.model_config import build_dit
    from dit_trainer.errors import ConfigError
    from dit_trainer_mindspore.convert import _recorded_block_options, torch_to_mindspore
    from dit_trainer_mindspore.core import mindspore_config

    sd = {k: v.numpy() for k, v in build_dit({**TINY, "mlp": "swiglu"}).state_dict().items()}
    with pytest.raises(ConfigError, match="ckpt uses model.mlp swiglu, but MindSpore's DiT has only"):
        torch_to_mindspore(sd, source="ckpt")
    assert len(torch_to_mindspore({k: v.numpy() for k, v in build_dit(TINY).state_dict().items()})) > 0
    # RoPE shows in no tensor: a checkpoint folder's config.yaml tells it.
    (tmp_path / "config.yaml").write_text("model:\n  name: DiT-S/2\n  rope: true\n")
    assert _recorded_block_options(str(tmp_path)) == {"rope": True}
    cfg = build_config({"output_dir": str(tmp_path), "backend": "mindspore", "model": {"name": "DiT-S/2", "rope": True}})
    with pytest.raises(ConfigError, match="DiT-S/2 uses model.rope true, but backend mindspore has only .*backend torch"):
        mindspore_config(cfg)


def test_a_run_sampled_with_autoguidance_is_not_exported_without_its_guide_silently(ours_dir, tmp_path, capsys):
    import shutil

    import yaml

    from dit_trainer.cli import main

    src = tmp_path / "run"
    shutil.copytree(ours_dir, src)
    config = yaml.safe_load((src / "config.yaml").read_text())
    config["sample"] = {"guide": "300", "guide_scale": 2.0}
    (src / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["convert", "--from", "ours", str(src), "--to", "diffusers", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "samples with autoguidance (sample.guide 300)" in err and "--without-guide" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
    assert main(["convert", "--from", "ours", str(src), "--to", "diffusers", str(tmp_path / "out"),
                 "--without-guide"]) == 0
    assert (tmp_path / "out" / "model_index.json").is_file()
