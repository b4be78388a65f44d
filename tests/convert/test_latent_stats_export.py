"""A model trained on per-channel normalised latents exports its statistics: diffusers' VAE config
`latents_mean`/`latents_std` (SDXL's convention), read back by `dit convert` and our DiTPipeline."""

import json

import pytest
import torch
import yaml

pytest.importorskip("diffusers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.convert import convert, read  # noqa: E402
from dit_trainer.convert.pipeline import DiTPipeline  # noqa: E402
from dit_trainer.data.shards import read_manifest  # noqa: E402
from tests.train.trainer_helpers import tiny_config  # noqa: E402
from tests.vae.autoencoders import save_kl_f16c32, write_images  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from dit_trainer.train import DiTTrainer

    root = tmp_path_factory.mktemp("stats_export")
    shards = root / "shards"
    assert main(["extract", "--data-path", write_images(root / "images"), "--vae", save_kl_f16c32(root / "vae"),
                 "--image-size", "64", "--out", str(shards), "--workers", "0", "--no-progress"]) == 0
    cfg = tiny_config(root / "run", data={"path": str(shards)}, train={"global_batch_size": 4, "max_steps": 1})
    for key in ("input_size", "in_channels", "num_classes"):
        del cfg["model"][key]
    DiTTrainer(cfg).train()
    return {"run": root / "run", "manifest": read_manifest(shards)}


def test_diffusers_folder_carries_the_stats_and_reads_back(run, tmp_path):
    m = run["manifest"]
    out, bundle = convert("ours", run["run"], "diffusers", tmp_path / "d")
    assert bundle.latent_mean == m["latent_mean"] and bundle.latent_std == m["latent_std"]
    vae_cfg = json.loads((out / "vae" / "config.json").read_text())
    sf = m["scaling_factor"]
    # What an SDXL-style pipeline decodes: z · latents_std / scaling_factor + latents_mean = (z · std + mean) / sf.
    assert vae_cfg["latents_mean"] == pytest.approx([v / sf for v in m["latent_mean"]], rel=1e-12)
    assert vae_cfg["latents_std"] == pytest.approx(m["latent_std"], rel=1e-12)
    back = read("diffusers", out)
    assert back.latent_mean == pytest.approx(m["latent_mean"], rel=1e-9, abs=1e-12)
    assert back.latent_std == pytest.approx(m["latent_std"], rel=1e-12)
    # A run folder written from it keeps them in config.yaml, as `dit sample` reads them, and the image size.
    ours, _ = convert("diffusers", out, "ours", tmp_path / "o")
    data = yaml.safe_load((ours / "config.yaml").read_text())["data"]
    assert data["latent_mean"] == pytest.approx(m["latent_mean"], rel=1e-9, abs=1e-12) and data["image_size"] == 64


def test_pipelines_decode_with_the_stats(run, tmp_path):
    from diffusers import DiTPipeline as DiffusersPipeline

    m = run["manifest"]
    out, _ = convert("ours", run["run"], "diffusers", tmp_path / "d")
    pipe = DiTPipeline.from_pretrained(out)
    _, factor, shift = pipe.decoder
    std, mean = torch.tensor(m["latent_std"]), torch.tensor(m["latent_mean"])
    # Per-channel factor and shift: z / factor + shift = (z · std + mean) / scaling_factor.
    torch.testing.assert_close(factor, (m["scaling_factor"] / std).float())
    torch.testing.assert_close(shift, (mean / m["scaling_factor"]).float())
    assert pipe(class_labels=[0], num_inference_steps=2, output_type="np").shape == (1, 64, 64, 3)
    # diffusers' own DiTPipeline loads the folder and runs; it divides by scaling_factor alone (docs/data.md
    # shows the decode wrapper that applies latents_mean/std).
    theirs = DiffusersPipeline.from_pretrained(out)
    # guidance_scale 1: its null class is 1000, past this model's two classes.
    images = theirs(class_labels=[0], num_inference_steps=2, guidance_scale=1.0, output_type="np").images
    assert images.shape == (1, 64, 64, 3)
    # docs/data.md's wrapper: the VAE then decodes (z · std + mean) / scaling_factor, and the image changes.
    mean_c = torch.tensor(theirs.vae.config.latents_mean).view(1, -1, 1, 1)
    std_c = torch.tensor(theirs.vae.config.latents_std).view(1, -1, 1, 1)
    decode, seen = theirs.vae.decode, []

    def wrapped(z, *args, **kwargs):
        seen.append(z)
        return decode(z * std_c.to(z) + mean_c.to(z), *args, **kwargs)

    theirs.vae.decode = wrapped
    fixed = theirs(class_labels=[0], num_inference_steps=2, guidance_scale=1.0, output_type="np").images
    assert len(seen) == 1 and fixed.shape == images.shape and abs(fixed - images).max() > 1e-3
